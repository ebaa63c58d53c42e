"""What do the checks cost? One process, one model, the same batches, timed side by side.

    python scripts/bench_overhead.py --device cpu --json out.json            # CPU bench preset
    python scripts/bench_overhead.py --device cuda --config configs/aam.toml  # the default AAM size

Modes, each a full training step (forward, loss, backward, clip, AdamW step):
  plain           no checks at all
  watch           the default run: snapshot, on-device flags for every module output / loss / gradient /
                  parameter, one host sync per micro-batch, the batch checks
  trace           the op-level tracer (what only the replayed micro-batch pays)
  detect_anomaly  torch.autograd.detect_anomaly() around a plain step
Modes are interleaved within every repeat (so drift hits all alike), after warm-up; the median is reported,
with device synchronisation on CUDA. On CUDA it also counts host syncs of the watch step with
torch.cuda.set_sync_debug_mode("warn") (each sync is a warning).
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from debug_nan.checks.tracer import Tracer  # noqa: E402
from debug_nan.report.log import Log  # noqa: E402
from debug_nan.settings import build_settings  # noqa: E402
from debug_nan.train.aam_task import build_aam_task  # noqa: E402
from debug_nan.train.loop import Trainer, resolve_device  # noqa: E402

MODES = ("plain", "watch", "trace", "detect_anomaly")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_step(t: Trainer, batch, hooks_off: bool = True) -> None:
    t.optimizer.zero_grad(set_to_none=True)
    loss, _ = t.compute_loss(batch_to(t, batch))
    t.backward(loss)
    torch.nn.utils.clip_grad_norm_(t.model.parameters(), t.s.max_grad_norm)
    t.optimizer.step()
    t.scheduler.step()


def batch_to(t: Trainer, batch):
    from debug_nan.checks.stats import move_to

    return move_to(batch, t.device)


def traced_step(t: Trainer, batch) -> None:
    with Tracer(t.model):
        plain_step(t, batch)


def anomaly_step(t: Trainer, batch) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autograd.detect_anomaly():
            plain_step(t, batch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--config", default=str(REPO / "configs" / "bench-cpu.toml"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args()
    torch.set_num_threads(torch.get_num_threads())
    settings = build_settings(args.config, {"device": args.device, "max_steps": 10**9, "data_dir": "/nonexistent"})
    quiet = Log(stream=io.StringIO())
    device = resolve_device(settings.device, quiet)
    task = build_aam_task(settings, quiet)
    trainer = Trainer(task, settings, quiet, device)
    batch = next(iter(task.batches))  # one fixed batch: every step does the same work
    batches = [batch]
    watch = trainer.watch

    def watch_step(i: int) -> None:
        quiet.stream.seek(0)
        quiet.stream.truncate()
        finding, _ = trainer.train_step(i, itertools.repeat(batches[i % len(batches)]), None)
        assert finding is None, finding

    modes = [m for m in args.modes.split(",") if m in MODES]
    step_fns = {
        "plain": lambda i: plain_step(trainer, batches[i % len(batches)]),
        "watch": watch_step,
        "trace": lambda i: traced_step(trainer, batches[i % len(batches)]),
        "detect_anomaly": lambda i: anomaly_step(trainer, batches[i % len(batches)]),
    }
    times: dict[str, list[float]] = {m: [] for m in modes}
    for rep in range(args.warmup + args.repeats):
        for mode in modes:
            watch.enabled = mode == "watch"  # hooks stay registered but return at once in other modes
            sync(device)
            start = time.perf_counter()
            step_fns[mode](rep)
            sync(device)
            if rep >= args.warmup:
                times[mode].append(time.perf_counter() - start)
            watch.discard()
    watch.enabled = True
    ms = {m: 1000 * statistics.median(v) for m, v in times.items()}
    # paired: each repeat's time over the same repeat's plain time, then the median of those ratios
    ratio = ({m: statistics.median(a / b for a, b in zip(v, times["plain"])) for m, v in times.items()}
             if "plain" in times else {})
    syncs = None
    if device.type == "cuda" and "watch" in modes:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                watch_step(10**6)
            finally:
                torch.cuda.set_sync_debug_mode(0)
        syncs = sum("synchroniz" in str(w.message).lower() for w in caught)
    cfg = {k: getattr(settings, k) for k in ("token_limit", "batch_size", "d_model", "heads", "asv_layers",
                                             "sample_layers", "encoder_layers", "precision")}
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    print(f"device {name} | config {Path(args.config).name} {cfg} | {args.repeats} repeats after {args.warmup} "
          f"warm-up, median")
    print(f"{'mode':<16}{'ms/step':>10}{'x plain':>10}   (x plain: median of per-repeat paired ratios)")
    for m in modes:
        print(f"{m:<16}{ms[m]:>10.1f}{ratio.get(m, float('nan')):>10.3f}")
    if syncs is not None:
        print(f"host syncs in one watch step (torch.cuda.set_sync_debug_mode): {syncs} (one per micro-batch)")
    if args.json_path:
        out = {"device": name, "config": {"file": Path(args.config).name, **cfg}, "ms_per_step": ms,
               "ratio_to_plain": ratio, "repeats": args.repeats, "warmup": args.warmup, "torch": torch.__version__,
               "host_syncs_per_watch_step": syncs, "samples_ms": {m: [1000 * x for x in v] for m, v in times.items()}}
        Path(args.json_path).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()
