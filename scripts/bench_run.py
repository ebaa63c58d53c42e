"""The cost of `debug-nan run` on a user's own training loop: the same script, plain and through `run`.

    python scripts/bench_run.py [--hidden 128 --layers 4 --seq 128 --batch 8] [--steps 30 --warmup 16]
                                [--repeats 5] [--accumulate 1] [--threads 1] [--compile] [--json out.json]
    python scripts/bench_run.py --model gpt2 --device cuda     # a bench_models preset (its own batch and seq)
    python scripts/bench_run.py --model tiny --eval-batches 4   # + a validation pass after each step, timed apart
    python scripts/bench_run.py --shapes 6x256x128x4,2x128x64x8 --eval-batches 4 --repeats 7
                                # GPT-2-like models (blocks x d_model x seq x batch), side by side

The user's script is this file with --as-user: a plain PyTorch loop over a BertForMaskedLM built from a config (no
download), or over a scripts/bench_models.py preset (--model deep|gpt2|tiny: no transformers import), or over that
file's nanoGPT-like TinyGPT at --layers blocks, d_model --hidden, --seq, --batch, --vocab (--model gpt), on
--device, which times its own optimizer steps after --warmup (start-up and the first steps excluded; on CUDA the
device is synchronised around each step) and prints the median ms per step (--compile: the model through
torch.compile, compiled within the warmup). Each pair runs `python bench_run.py --as-user ...` and `python -m
debug_nan run -- python bench_run.py --as-user ...` as fresh processes, alternately (plain first in even pairs,
watched first in odd ones). Reported: the median ms per step of each, and the medians of the per-pair ratios of wall
and CPU time (CPU time: steadier on a shared machine). The default --warmup 16 times the steady state: a run's first
16 steps measure every module output, later ones on the CPU on a stride
(debug_nan/engine/session/output_schedule.py).
--eval-batches N: after each step the loop runs N forwards in eval() + no_grad (a validation pass: `run` checks each
one's output, one host sync each) and their median ms per forward is reported beside the step's, with its ratio.
--shapes LxDxSxB,...: --model gpt at each shape (blocks x d_model x seq x batch, heads of 64); every repeat runs one
pair per shape, so a shared machine's load weighs on every shape's pairs alike; one table at the end, with the
1-minute load average before each pair. --split: instead of pairs, one watched run per model that prints the CPU
time of the watch's parts per steady step (Split).
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
        from bench_models import PRESETS, LMShape, TinyGPT, lm_loss

        shape = PRESETS[a.model] if a.model in PRESETS else \
            LMShape(blocks=a.layers, d_model=a.hidden, heads=max(1, a.hidden // 64), seq=a.seq, batch=a.batch,
                    vocab=a.vocab)
        model = TinyGPT(shape).to(a.device)

        def preset_loss(g):
            tokens = torch.randint(0, shape.vocab, (shape.batch, shape.seq + 1), generator=g).to(a.device)
            return lm_loss(model, {"idx": tokens[:, :-1], "targets": tokens[:, 1:]})

        return model, preset_loss
    from transformers import BertConfig, BertForMaskedLM

    model = BertForMaskedLM(BertConfig(vocab_size=a.vocab, hidden_size=a.hidden, num_hidden_layers=a.layers,
                                       num_attention_heads=max(1, a.hidden // 32), intermediate_size=4 * a.hidden,
                                       max_position_embeddings=a.seq)).to(a.device)

    def bert_loss(g):
        ids = torch.randint(5, a.vocab, (a.batch, a.seq), generator=g)
        labels = torch.where(torch.rand(a.batch, a.seq, generator=g) < 0.15, ids, torch.full_like(ids, -100))
        return model(input_ids=ids.to(a.device), labels=labels.to(a.device)).loss

    return model, bert_loss


def as_user(a) -> None:
    import torch

    torch.set_num_threads(a.threads)
    model, next_loss = user_model(a)
    steady = [False]
    split = Split(steady) if a.split and "debug_nan.drivers.run.hooks" in sys.modules else None
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if a.compile:
        model = torch.compile(model)
    g = torch.Generator().manual_seed(0)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    times, cpu, evals = [], [], []
    for step in range(a.warmup + a.steps):
        steady[0] = step >= a.warmup
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
    if split is not None:
        split.show(a.steps, 1000 * statistics.median(cpu))


class Split:
    """--split, inside the watched run: the CPU time of the watch's parts in the steady steps, per step. Each part
    is a method of debug-nan's wrapped with a timer (the parts do not overlap; `listener` is every hook event the
    watch handles, the parts above included)."""

    PARTS = (("state check (parameters + optimizer state)", "debug_nan.engine.watch.watch", "Watch", "watch_params"),
             ("gradient norms", "debug_nan.engine.watch.watch", "Watch", "watch_grads"),
             ("the one sync + its reading", "debug_nan.engine.watch.watch", "Watch", "sync"),
             ("module outputs (aminmax, on a stride)", "debug_nan.engine.watch.watch", "Watch", "_on_output"),
             ("state copy (every few steps)", "debug_nan.engine.session.copies", "StateCopies", "_copy"),
             ("batch and RNG capture", "debug_nan.engine.session.session", "StepSession", "begin_micro"),
             ("eval forwards: arguments + RNG", "debug_nan.drivers.eval_forwards", "EvalForwards", "begin"),
             ("eval forwards: the output's check", "debug_nan.drivers.eval_forwards", "EvalForwards", "end"),
             ("listener", "debug_nan.app.run_watch", "Watch", ("micro_begin", "backward_begin", "backward_end",
                                                                "step_begin", "step_end", "eval_begin", "eval_end")))

    def __init__(self, steady: list):
        import importlib

        self.steady, self.seconds, self.calls = steady, {}, {}
        for label, module, owner, names in self.PARTS:
            cls = getattr(importlib.import_module(module), owner)
            for name in (names,) if isinstance(names, str) else names:
                setattr(cls, name, self._timed(label, getattr(cls, name)))
        recorder = importlib.import_module("debug_nan.drivers.run.recorder").Recorder
        call = recorder.__torch_function__

        def counted(mode, *args, **kwargs):  # (each call through the recorder: ~3.6 us of dispatch on top)
            if self.steady[0]:
                self.calls["recorder"] = self.calls.get("recorder", 0) + 1
            return call(mode, *args, **kwargs)

        recorder.__torch_function__ = counted

    def _timed(self, label: str, method):
        def timed(*args, **kwargs):
            if not self.steady[0]:
                return method(*args, **kwargs)
            start = time.process_time()
            try:
                return method(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.process_time() - start
                self.calls[label] = self.calls.get(label, 0) + 1
        return timed

    def show(self, steps: int, plain_step_ms: float) -> None:
        print(f"split of the watch, CPU ms per steady step (the watched step: {plain_step_ms:.1f} ms CPU in all):")
        parts = 0.0
        for label, *_ in self.PARTS:
            ms = 1000 * self.seconds.get(label, 0.0) / steps
            parts += ms if label not in ("listener", "module outputs (aminmax, on a stride)") else 0.0
            print(f"  {ms:8.2f} ms  {self.calls.get(label, 0) / steps:6.1f} calls  {label}")
        listener = 1000 * self.seconds.get("listener", 0.0) / steps
        print(f"  {listener - parts:8.2f} ms          the listener's other bookkeeping (history, decisions, tapes)")
        print(f"  {self.calls.get('recorder', 0) / steps:8.1f} calls through the recorder per step (the script's "
              f"torch calls while a tape is open)")


def run_once(a, watched: bool, extra: tuple = ()) -> str:
    """The user script's stdout, from its line `ms_per_step ...` on."""
    user = [sys.executable, str(Path(__file__).resolve()), "--as-user", *a.user_args, *extra]
    command = [sys.executable, "-m", "debug_nan", "run", "--", *user] if watched else user
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return "ms_per_step" + done.stdout.split("ms_per_step", 1)[1]


def measure(a, watched: bool) -> tuple[float, float, float]:
    """(wall ms per step, CPU ms per step, wall ms per eval forward) of one run."""
    wall, cpu, evaluation = run_once(a, watched).split("\n", 1)[0].split()[1:]
    return float(wall), float(cpu), float(evaluation)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--as-user", action="store_true", help=argparse.SUPPRESS)
    for name, default in (("hidden", 128), ("layers", 4), ("seq", 128), ("batch", 8), ("steps", 30),
                          ("warmup", 16), ("accumulate", 1), ("threads", 1), ("vocab", 1000)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--eval-batches", type=int, default=0, help="forwards in eval() + no_grad after each step")
    p.add_argument("--model", choices=("bert", "gpt", "deep", "gpt2", "tiny"), default="bert",
                   help="BertForMaskedLM or TinyGPT (gpt) at --hidden/--layers/--seq/--batch, or a bench_models preset")
    p.add_argument("--shapes", default=None, help="TinyGPT shapes LxDxSxB (blocks x d_model x seq x batch), "
                   "comma-separated: each benchmarked as --model gpt, its pairs interleaved with the others'")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N [default: cpu]")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--split", action="store_true", help="one watched run that prints the CPU time of the watch's "
                   "parts per steady step (no pairs)")
    p.add_argument("--json", default=None)
    a = p.parse_args()
    if a.as_user:
        return as_user(a)
    if a.shapes:
        cases = []
        for shape in a.shapes.split(","):
            layers, hidden, seq, batch = (int(v) for v in shape.split("x"))
            cases.append((shape, argparse.Namespace(**{**vars(a), "model": "gpt", "layers": layers, "hidden": hidden,
                                                        "seq": seq, "batch": batch})))
    else:
        cases = [(a.model, a)]
    for _, case in cases:
        case.user_args = [f"--{k}={getattr(case, k)}" for k in (
            "model", "device", "hidden", "layers", "seq", "batch", "vocab", "steps", "warmup", "accumulate",
            "threads")] + [f"--eval-batches={a.eval_batches}"] + ["--compile"] * a.compile
    if a.split:
        for name, case in cases:
            print(f"{name}, load average {os.getloadavg()[0]:.1f}: " + run_once(case, True, ["--split"]).split(
                "\n", 1)[1], flush=True)
        return
    pairs = {name: [] for name, _ in cases}  # name -> [(load average, {watched: (wall, cpu, eval)})]
    for r in range(a.repeats):
        for name, case in cases:
            load, pair = os.getloadavg()[0], {}
            for mode in ((False, True) if r % 2 == 0 else (True, False)):
                pair[mode] = measure(case, mode)
            pairs[name].append((load, pair))
            evaluated = (f"; eval forward plain {pair[False][2]:.2f} ms, run {pair[True][2]:.2f} ms, ratio "
                         f"{pair[True][2] / pair[False][2]:.3f}" if a.eval_batches else "")
            print(f"{name} pair {r + 1} (load {load:.1f}): plain {pair[False][0]:.1f} ms/step, run "
                  f"{pair[True][0]:.1f} ms/step, ratio {pair[True][0] / pair[False][0]:.3f} wall / "
                  f"{pair[True][1] / pair[False][1]:.3f} CPU time{evaluated}", flush=True)
    results = {name: summary(runs, case.user_args) for (name, case), runs in zip(cases, pairs.values())}
    print("\nmedians of the pairs (steady state: after the first --warmup steps)")
    print(f"{'model':>14} | {'plain step':>10} | {'run step':>8} | {'ratio':>5} | {'CPU':>5} | {'plain eval':>10} | "
          f"{'run eval':>8} | {'ratio':>5} | load")
    for name, res in results.items():
        ev = (f"{res['plain_eval_ms']:>7.2f} ms | {res['run_eval_ms']:>5.2f} ms | {res['eval_ratio']:.3f}"
              if res["eval_ratio"] is not None else f"{'-':>10} | {'-':>8} | {'-':>5}")
        print(f"{name:>14} | {res['plain_ms']:>7.1f} ms | {res['run_ms']:>5.1f} ms | {res['ratio']:.3f} | "
              f"{res['cpu_ratio']:.3f} | {ev} | {res['load_min']:.1f}-{res['load_max']:.1f}")
    if a.json:
        Path(a.json).write_text(json.dumps(results if a.shapes else results[a.model], indent=1))


def summary(runs: list, settings: list[str]) -> dict:
    """The medians of one model's pairs: ms per step and per eval forward, and the per-pair ratios'."""
    def median(f):
        values = [f(pair) for _, pair in runs]
        return statistics.median(values) if values else None

    evaluated = all(pair[False][2] for _, pair in runs)
    ratios = [pair[True][0] / pair[False][0] for _, pair in runs]
    return {"plain_ms": median(lambda p: p[False][0]), "run_ms": median(lambda p: p[True][0]),
            "ratio": statistics.median(ratios), "cpu_ratio": median(lambda p: p[True][1] / p[False][1]),
            "pairs": ratios, "cpu_pairs": [pair[True][1] / pair[False][1] for _, pair in runs],
            "plain_eval_ms": median(lambda p: p[False][2]) if evaluated else None,
            "run_eval_ms": median(lambda p: p[True][2]) if evaluated else None,
            "eval_ratio": median(lambda p: p[True][2] / p[False][2]) if evaluated else None,
            "eval_pairs": [pair[True][2] / pair[False][2] for _, pair in runs] if evaluated else [],
            "settings": settings, "load": [load for load, _ in runs],
            "load_min": min(load for load, _ in runs), "load_max": max(load for load, _ in runs)}


if __name__ == "__main__":
    main()
