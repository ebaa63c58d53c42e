"""Peak memory of a plain training loop against the same training under debug-nan (--snapshot host/device/params/off),
and of an optimizer-phase replay under the op-level tracer, on GPT-like models with AdamW (foreach).

    python scripts/bench_memory.py --device cpu                      # sizes 5m and 50m, every mode
    python scripts/bench_memory.py --device cuda --json mem.json     # + torch.cuda.max_memory_allocated
    python scripts/bench_memory.py --device cuda --sizes aam,100m    # the built-in AAM model, ~100M parameters

Every (size, mode) runs in its own subprocess, so peaks do not mix. Modes:
  plain         model + AdamW: zero_grad, forward, loss, backward, step; nothing else
  host          the CLI's Trainer (the watch on every step) with --snapshot host (the default)
  device        the same with --snapshot device
  params        the same with --snapshot params (no copy of the optimizer state)
  off           the same with --snapshot off
  replay        `host`, then the optimizer step of the last step replayed under the tracer (what a parameter
                trip costs: the tracer judges every in-place foreach op of AdamW)
Reported per run: peak RSS of the process (ru_maxrss; it includes the Python + torch baseline, printed too) and,
on CUDA, torch.cuda.max_memory_allocated. `x plain` divides by the plain run's figure; `+ x params` is the
increase over plain in units of the parameters' size (float32 bytes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MODES = ("plain", "host", "device", "params", "off", "replay")
SIZES = {  # bench_models.LMShape fields; about 5M and 50M parameters (and a tiny one for the smoke test)
    "tiny": dict(blocks=1, d_model=32, heads=2, seq=16, batch=2, vocab=64),
    "5m": dict(blocks=4, d_model=256, heads=4, seq=64, batch=4, vocab=4096),
    "50m": dict(blocks=8, d_model=640, heads=10, seq=64, batch=4, vocab=8192),
    "100m": dict(blocks=12, d_model=768, heads=12, seq=128, batch=8, vocab=8192),  # GPT-2 small's blocks
}
# the built-in AAM model at a config's size, on synthetic data (one batch), with the same AdamW as the GPT sizes
AAM_SIZES = {"aam": REPO / "configs" / "aam.toml", "aam-tiny": REPO / "configs" / "tiny.toml"}


def build(size: str, steps: int):
    """(model, one batch, loss(model, batch) -> scalar, the task for the watched modes, its settings' config)."""
    import io
    import tempfile

    import torch
    from bench_models import LMShape, TinyGPT, lm_loss
    from bench_overhead import chdir  # (contextlib.chdir is Python 3.11+)

    from debug_nan.aam.task import build_aam_task
    from debug_nan.drivers.task import Task, split_loss
    from debug_nan.presentation.log import Log
    from debug_nan.app.job_settings import build_settings

    torch.manual_seed(0)
    if size in AAM_SIZES:
        settings = build_settings(str(AAM_SIZES[size]), {"max_steps": steps})
        with tempfile.TemporaryDirectory() as empty, chdir(empty):  # no ./data: synthetic data
            task = build_aam_task(settings.aam, settings.train, Log(stream=io.StringIO()))
        batch = next(iter(task.batches))
        return task.model, batch, lambda m, b: split_loss(task.loss(m, b))[0], task, str(AAM_SIZES[size])
    shape = LMShape(**SIZES[size])
    model = TinyGPT(shape, dropout=0.0)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, shape.vocab, (shape.batch, shape.seq + 1), generator=g)
    batch = {"idx": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}
    return model, batch, lm_loss, Task(model=model, batches=[batch], loss=lm_loss, name=size), None


def rss_mb() -> float:
    """Peak resident set size of this process so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def child(size: str, mode: str, device_spec: str, steps: int) -> dict:
    """One measurement, in this (fresh) process."""
    sys.path[:0] = [str(REPO), str(REPO / "scripts")]
    import torch

    from debug_nan.drivers.trainer.loop import Trainer
    from debug_nan.engine.stats import move_to
    from debug_nan.app.job_settings import build_settings

    baseline = rss_mb()
    device = torch.device("cuda" if device_spec == "auto" and torch.cuda.is_available() else
                          "cpu" if device_spec == "auto" else device_spec)
    model, batch, loss_fn, task, config = build(size, steps)
    n_params = sum(p.numel() for p in model.parameters())
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    def adamw(params):  # foreach on the CPU too (torch's CUDA default; on the CPU it defaults to a for-loop)
        return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01, foreach=True)

    if mode == "plain":
        model = model.to(device)
        optimizer = adamw(model.parameters())
        on_device = move_to(batch, device)
        for _ in range(steps):
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model, on_device).backward()
            optimizer.step()
    else:
        settings = build_settings(config, {"device": str(device), "max_steps": steps, "report": None,
                                           "snapshot": "host" if mode == "replay" else mode})
        task = dataclasses.replace(task, batches=[batch], optimizer=adamw)
        trainer = Trainer(task, settings, lambda *a, **k: None, device)
        stream = iter(lambda: batch, None)  # the same batch forever
        for step in range(1, steps + 1):
            finding = trainer.train_step(step, stream)
            assert finding is None, finding
        if mode == "replay":
            trainer.pinpointer.replay(trainer.session.previous, trainer.accumulation_steps, optimizer=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {"size": size, "mode": mode, "device": str(device), "params": n_params, "baseline_rss_mb": baseline,
            "peak_rss_mb": rss_mb(),
            "cuda_max_allocated_mb": (torch.cuda.max_memory_allocated(device) / 2**20
                                      if device.type == "cuda" else None)}


def measure(size: str, mode: str, device: str, steps: int) -> dict:
    proc = subprocess.run([sys.executable, __file__, "--child", size, mode, "--device", device, "--steps",
                           str(steps)], capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    if proc.returncode != 0:
        raise SystemExit(f"bench_memory: {size} {mode} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(results: list[dict]) -> list[str]:
    lines = []
    cuda = any(r["cuda_max_allocated_mb"] is not None for r in results)
    head = f"{'size':<6} {'params':>8} {'mode':<7} {'peak RSS MB':>12} {'x plain':>8} {'+ x params':>10}"
    if cuda:
        head += f" {'CUDA max alloc MB':>18} {'x plain':>8} {'+ x params':>10}"
    lines += [head, "-" * len(head)]
    for size in dict.fromkeys(r["size"] for r in results):
        rows = [r for r in results if r["size"] == size]
        plain = next((r for r in rows if r["mode"] == "plain"), None)
        for r in rows:
            param_mb = r["params"] * 4 / 2**20
            line = f"{size:<6} {r['params'] / 1e6:>7.1f}M {r['mode']:<7} {r['peak_rss_mb']:>12.0f}"
            line += _ratio(r["peak_rss_mb"], plain["peak_rss_mb"] if plain else None, param_mb)
            if cuda:
                line += f" {r['cuda_max_allocated_mb']:>18.0f}" + _ratio(
                    r["cuda_max_allocated_mb"], plain["cuda_max_allocated_mb"] if plain else None, param_mb)
            lines.append(line)
    lines.append(f"(Python + torch baseline RSS before the model: {min(r['baseline_rss_mb'] for r in results):.0f} MB)")
    return lines


def _ratio(value: float, plain: float | None, param_mb: float) -> str:
    if not plain:
        return f" {'-':>8} {'-':>10}"
    return f" {value / plain:>7.2f}x {(value - plain) / param_mb:>+9.2f}x"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto [default: cpu]")
    parser.add_argument("--sizes", default="5m,50m", help=f"comma-separated, of {', '.join([*SIZES, *AAM_SIZES])}")
    parser.add_argument("--modes", default=",".join(MODES), help=f"comma-separated, of {', '.join(MODES)}")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per run [default: 3]")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--child", nargs=2, metavar=("SIZE", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(*args.child, args.device, args.steps)))
        return
    sizes, modes = args.sizes.split(","), args.modes.split(",")
    for name, allowed, given in (("--sizes", [*SIZES, *AAM_SIZES], sizes), ("--modes", MODES, modes)):
        unknown = [v for v in given if v not in allowed]
        if unknown:
            parser.error(f"{name}: unknown {', '.join(unknown)} (choose from {', '.join(allowed)})")
    results = [measure(size, mode, args.device, args.steps) for size in sizes for mode in modes]
    print(f"bench_memory: device {results[0]['device']}, {args.steps} steps, AdamW (foreach)")
    print("\n".join(table(results)))
    if args.json:
        Path(args.json).write_text(json.dumps({"device": results[0]["device"], "steps": args.steps,
                                               "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
