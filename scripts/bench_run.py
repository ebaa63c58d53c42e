"""The cost of `debug-nan run` on a user's own training loop: the same script, plain and through `run`.

    python scripts/bench_run.py [--hidden 128 --layers 4 --seq 128 --batch 8] [--steps 30 --warmup 16]
                                [--repeats 5] [--accumulate 1] [--threads 1] [--compile] [--json out.json]
    python scripts/bench_run.py --model gpt2 --device cuda     # a bench_models preset (its own batch and seq)
    python scripts/bench_run.py --model tiny --eval-batches 4   # + a validation pass after each step, timed apart

The user's script is this file with --as-user: a plain PyTorch loop over a BertForMaskedLM built from a config (no
download), or over a scripts/bench_models.py preset (--model deep|gpt2|tiny: no transformers import), on --device,
which times its own optimizer steps after --warmup (start-up and the first steps excluded; on CUDA the device is
synchronised around each step) and prints the median ms per step (--compile: the model through torch.compile,
compiled within the warmup). Each pair runs `python bench_run.py --as-user ...` and `python -m debug_nan run --
python bench_run.py --as-user ...` as fresh processes, alternately (plain first in even pairs, watched first in odd
ones). Reported: the median ms per step of each, and the medians of the per-pair ratios of wall and CPU time (CPU
time: steadier on a shared machine). The default --warmup 16 times the steady state: a run's first 16 steps measure
every module output, later ones on the CPU on a stride (debug_nan/engine/session/output_schedule.py).
--eval-batches N: after each step the loop runs N forwards in eval() + no_grad (a validation pass: `run` checks each
one's output, one host sync each) and their median ms per forward is reported beside the step's, with its ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def user_model(a):
    """(model, loss_of(generator) -> the next micro-batch's loss) on a.device."""
    import torch

    torch.manual_seed(0)
    if a.model != "bert":
        sys.path.insert(0, str(REPO / "scripts"))
        from bench_models import PRESETS, TinyGPT, lm_loss

        shape = PRESETS[a.model]
        model = TinyGPT(shape).to(a.device)

        def preset_loss(g):
            tokens = torch.randint(0, shape.vocab, (shape.batch, shape.seq + 1), generator=g).to(a.device)
            return lm_loss(model, {"idx": tokens[:, :-1], "targets": tokens[:, 1:]})

        return model, preset_loss
    from transformers import BertConfig, BertForMaskedLM

    model = BertForMaskedLM(BertConfig(vocab_size=1000, hidden_size=a.hidden, num_hidden_layers=a.layers,
                                       num_attention_heads=max(1, a.hidden // 32), intermediate_size=4 * a.hidden,
                                       max_position_embeddings=a.seq)).to(a.device)

    def bert_loss(g):
        ids = torch.randint(5, 1000, (a.batch, a.seq), generator=g)
        labels = torch.where(torch.rand(a.batch, a.seq, generator=g) < 0.15, ids, torch.full_like(ids, -100))
        return model(input_ids=ids.to(a.device), labels=labels.to(a.device)).loss

    return model, bert_loss


def as_user(a) -> None:
    import torch

    torch.set_num_threads(a.threads)
    model, next_loss = user_model(a)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if a.compile:
        model = torch.compile(model)
    g = torch.Generator().manual_seed(0)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    times, cpu, evals = [], [], []
    for step in range(a.warmup + a.steps):
        if a.eval_batches:  # a validation pass, timed apart from the step
            model.eval()
            with torch.no_grad():
                for _ in range(a.eval_batches):
                    sync()
                    start = time.perf_counter()
                    next_loss(g)
                    sync()
                    if step >= a.warmup:
                        evals.append(time.perf_counter() - start)
            model.train()
        sync()
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(a.accumulate):
            loss = next_loss(g) / a.accumulate
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        sync()
        if step >= a.warmup:
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
    print(f"ms_per_step {1000 * statistics.median(times):.3f} {1000 * statistics.median(cpu):.3f} "
          f"{1000 * statistics.median(evals) if evals else 0.0:.3f}")


def measure(a, watched: bool) -> tuple[float, float, float]:
    """(wall ms per step, CPU ms per step, wall ms per eval forward) of one run."""
    user = [sys.executable, str(Path(__file__).resolve()), "--as-user", *a.user_args]
    command = [sys.executable, "-m", "debug_nan", "run", "--", *user] if watched else user
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    wall, cpu, evaluation = done.stdout.split("ms_per_step")[1].split()
    return float(wall), float(cpu), float(evaluation)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--as-user", action="store_true", help=argparse.SUPPRESS)
    for name, default in (("hidden", 128), ("layers", 4), ("seq", 128), ("batch", 8), ("steps", 30),
                          ("warmup", 16), ("accumulate", 1), ("threads", 1), ("eval_batches", 0)):
        p.add_argument(f"--{name.replace('_', '-')}", type=int, default=default)
    p.add_argument("--model", choices=("bert", "deep", "gpt2", "tiny"), default="bert",
                   help="BertForMaskedLM at --hidden/--layers/--seq/--batch, or a bench_models preset")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N [default: cpu]")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if a.as_user:
        return as_user(a)
    a.user_args = [f"--{k}={getattr(a, k)}" for k in ("model", "device", "hidden", "layers", "seq", "batch", "steps",
                                                      "warmup", "accumulate", "threads")] + \
        [f"--eval-batches={a.eval_batches}"] + ["--compile"] * a.compile
    plain, watched, ratios, cpu_ratios, eval_ratios = [], [], [], [], []
    for r in range(a.repeats):
        pair = {}
        for mode in ((False, True) if r % 2 == 0 else (True, False)):
            pair[mode] = measure(a, mode)
        plain.append(pair[False][0])
        watched.append(pair[True][0])
        ratios.append(pair[True][0] / pair[False][0])
        cpu_ratios.append(pair[True][1] / pair[False][1])
        if a.eval_batches:
            eval_ratios.append(pair[True][2] / pair[False][2])
        evaluated = (f"; eval forward plain {pair[False][2]:.2f} ms, run {pair[True][2]:.2f} ms, ratio "
                     f"{eval_ratios[-1]:.3f}" if a.eval_batches else "")
        print(f"pair {r + 1}: plain {pair[False][0]:.1f} ms/step, run {pair[True][0]:.1f} ms/step, ratio "
              f"{ratios[-1]:.3f} wall / {cpu_ratios[-1]:.3f} CPU time{evaluated}", flush=True)
    result = {"plain_ms": statistics.median(plain), "run_ms": statistics.median(watched),
              "ratio": statistics.median(ratios), "cpu_ratio": statistics.median(cpu_ratios), "pairs": ratios,
              "cpu_pairs": cpu_ratios, "settings": a.user_args, "load": os.getloadavg()[0],
              "eval_ratio": statistics.median(eval_ratios) if eval_ratios else None}
    print(f"median: plain {result['plain_ms']:.1f} ms/step, debug-nan run {result['run_ms']:.1f} ms/step, "
          f"median ratio {result['ratio']:.3f} wall / {result['cpu_ratio']:.3f} CPU time (load average "
          f"{result['load']:.1f})" + (f"; eval forward median ratio {result['eval_ratio']:.3f}" if eval_ratios else ""))
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
