"""The cost of `debug-nan run` on a user's own training loop: the same script, plain and through `run`.

    python scripts/bench_run.py [--hidden 128 --layers 4 --seq 128 --batch 8] [--steps 30 --warmup 16]
                                [--repeats 5] [--accumulate 1] [--threads 1] [--compile] [--json out.json]
    python scripts/bench_run.py --model gpt2 --device cuda     # a bench_models preset (its own batch and seq)
    python scripts/bench_run.py --model tiny --eval-batches 4   # + a validation pass after each step, timed apart
    python scripts/bench_run.py --shapes 6x256x128x4,2x128x64x8 --eval-batches 4 --repeats 7
                                # GPT-2-like models (blocks x d_model x seq x batch), side by side
    python scripts/bench_run.py --shapes 6x256x128x4,6x256x128x1 --eval-batches 4 --repeats 3 --alternate
                                # the pairs inside one watched run (steadier: see below)
    python scripts/bench_run.py --shapes 6x256x128x1 --alternate --without state-check   # what one part costs

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
--alternate: the pairs inside one process, for a machine whose speed drifts between processes (a shared one: the same
plain run took 113-140 ms a step from one process to the next). Each repeat is one `debug-nan run` of the script
whose steady steps alternate: watched, then paused (the hooks' `paused()`, as during a replay: each hook returns at
once, and no check, copy or capture runs), --steps of each; each watched step is divided by the mean of the paused
steps either side of it (its eval forwards by theirs), and the medians of those ratios are reported, pooled over
the repeats. What a paused step still pays for the hooks' early returns is timed on trivial calls and printed
(about 20 us a step). --without PART (repeatable): that part of the watch made a no-op in the watched run, so that
the ratio's drop is what the part costs, cache effects included (a diagnosis: the watch then misses what the part
checks).
"""

from __future__ import annotations

import argparse
import contextlib
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
    hooks = watch_hooks() if a.alternate else None
    for part in a.without:
        without(part)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    if a.compile:
        model = torch.compile(model)
    g = torch.Generator().manual_seed(0)
    sync = torch.cuda.synchronize if a.device.startswith("cuda") else (lambda: None)
    times, cpu, evals = [], [], []  # per steady step (per eval forward), with whether it was watched
    for step in range(a.warmup + a.steps * (2 if hooks is not None else 1)):
        steady[0] = step >= a.warmup
        # --alternate: after the warm-up, every other step (and the eval pass before it) runs with the hooks paused
        watched = hooks is None or step < a.warmup or (step - a.warmup) % 2 == 0
        with contextlib.nullcontext() if watched else hooks.paused():
            if a.eval_batches:  # a validation pass, timed apart from the step
                model.eval()
                with torch.no_grad():
                    for _ in range(a.eval_batches):
                        sync()
                        start = time.perf_counter()
                        next_loss(g)
                        sync()
                        if step >= a.warmup:
                            evals.append((watched, time.perf_counter() - start))
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
            times.append((watched, time.perf_counter() - start))
            cpu.append((watched, time.process_time() - start_cpu))
    if hooks is not None:
        return print_alternation(times, cpu, evals, a.eval_batches, paused_residual(hooks, optimizer))
    print(f"ms_per_step {1000 * statistics.median(t for _, t in times):.3f} "
          f"{1000 * statistics.median(t for _, t in cpu):.3f} "
          f"{1000 * statistics.median(t for _, t in evals) if evals else 0.0:.3f}")
    if split is not None:
        split.show(a.steps, 1000 * statistics.median(t for _, t in cpu))


WITHOUT = {  # --without PART: (module, class, method) made a no-op in the watched run: that part's marginal cost
    "state-check": ("debug_nan.engine.watch.watch", "Watch", "watch_params"),
    "grad-norms": ("debug_nan.engine.watch.watch", "Watch", "watch_grads"),
    "state-copy": ("debug_nan.engine.session.copies", "StateCopies", "_copy"),
    "batch-capture": ("debug_nan.engine.session.session", "StepSession", "begin_micro"),
    "module-outputs": ("debug_nan.engine.watch.watch", "Watch", "_on_output"),
}


def without(part: str) -> None:
    """--without: a diagnosis, not a run to trust (the watch misses what that part checks)."""
    import importlib

    module, owner, name = WITHOUT[part]
    setattr(getattr(importlib.import_module(module), owner), name, lambda *args, **kwargs: None)


def watch_hooks():
    """--alternate: the hooks of the `debug-nan run` this script runs under (app/run_fork.py keeps its watch)."""
    from debug_nan.app import run_fork

    if not run_fork._current:
        sys.exit("--alternate: run this under `debug-nan run` (bench_run.py does)")
    return run_fork._current[0].hooks


def neighbour_ratios(samples: list[tuple[bool, float]], per: int = 1) -> list[float]:
    """Each watched sample over the mean of the paused samples just before and after it (`per` samples a step:
    the eval forwards), so that a drift of the machine's speed cancels. [(watched, seconds)] in run order."""
    steps = [samples[i:i + per] for i in range(0, len(samples), per)]
    ratios = []
    for i in range(1, len(steps) - 1):
        here, around = steps[i], steps[i - 1] + steps[i + 1]
        if here[0][0] and not any(w for w, _ in around):
            ratios.append(statistics.median(t for _, t in here) / statistics.median(t for _, t in around))
    return ratios


def paused_residual(hooks, optimizer, n: int = 2000) -> float:
    """What a paused step still pays for debug-nan (microseconds): its hooks' early returns, timed on trivial calls.
    Per micro-batch: the root's forward pre- and post-hook (on an Identity carrying the same hooks, against a bare
    one), the patched torch.autograd.backward (on a scalar, against the original), the optimizer step's pre- and
    post-hook."""
    import torch

    original = next(f for owner, name, f in hooks._patched if owner is torch.autograd and name == "backward")

    def per_call(fn) -> float:
        fn()
        start = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - start) / n * 1e6

    hooked, bare = torch.nn.Identity(), torch.nn.Identity()
    handles = [hooked.register_forward_pre_hook(hooks._forward_pre_hook, with_kwargs=True),
               hooked.register_forward_hook(hooks._forward_post_hook, with_kwargs=True, always_call=True)]
    x = torch.ones(1, requires_grad=True)
    with hooks.paused():
        module = per_call(lambda: hooked(x)) - per_call(lambda: bare(x))
        backward = per_call(lambda: torch.autograd.backward((x * 1).sum())) - \
            per_call(lambda: original((x * 1).sum()))
        step = per_call(lambda: (hooks.step_pre(optimizer, (optimizer,), {}), hooks.step_post(optimizer, (), {})))
    for h in handles:
        h.remove()
    return max(0.0, module) + max(0.0, backward) + step


def print_alternation(times, cpu, evals, eval_batches: int, residual_us: float) -> None:
    """One line `alternate` + JSON: the medians of the watched and paused steps and of the neighbour ratios."""
    def medians(samples, per=1):
        ratios = neighbour_ratios(samples, per)
        return {"watched_ms": 1000 * statistics.median(t for w, t in samples if w),
                "paused_ms": 1000 * statistics.median(t for w, t in samples if not w),
                "ratios": ratios, "ratio": statistics.median(ratios) if ratios else None}

    out = {"wall": medians(times), "cpu": medians(cpu), "paused_residual_us": residual_us}
    if evals:
        out["eval"] = medians(evals, eval_batches)
    print("alternate " + json.dumps(out))


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


def run_once(a, watched: bool, extra: tuple = (), marker: str = "ms_per_step") -> str:
    """The user script's stdout, from its line `ms_per_step ...` (`marker`) on."""
    user = [sys.executable, str(Path(__file__).resolve()), "--as-user", *a.user_args, *extra]
    command = [sys.executable, "-m", "debug_nan", "run", "--", *user] if watched else user
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p))
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
    return marker + done.stdout.split(marker, 1)[1]


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
    p.add_argument("--alternate", action="store_true", help="pairs inside one watched run: after the warm-up the "
                   "steps alternate between watched and paused hooks (--steps of each); each watched step against "
                   "the paused steps either side of it")
    p.add_argument("--without", action="append", default=[], choices=sorted(WITHOUT),
                   help="a diagnosis: this part of the watch made a no-op in the watched run (repeatable)")
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
            "threads")] + [f"--eval-batches={a.eval_batches}"] + ["--compile"] * a.compile + \
            [f"--without={part}" for part in a.without]
    if a.split:
        for name, case in cases:
            print(f"{name}, load average {os.getloadavg()[0]:.1f}: " + run_once(case, True, ["--split"]).split(
                "\n", 1)[1], flush=True)
        return
    if a.alternate:
        return alternate(a, cases)
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
        write_json(a.json, results if a.shapes else results[a.model])


def alternate(a, cases) -> None:
    """--alternate: --repeats watched runs per model (interleaved with the other models'), each its steps alternating
    watched and paused; the medians of every run's neighbour ratios pooled."""
    runs = {name: [] for name, _ in cases}
    for r in range(a.repeats):
        for name, case in cases:
            load = os.getloadavg()[0]
            line = run_once(case, True, ["--alternate"], marker="alternate").split("\n", 1)[0]
            out = json.loads(line.split(" ", 1)[1])
            runs[name].append(dict(out, load=load))
            ev = out.get("eval")
            print(f"{name} run {r + 1} (load {load:.1f}): watched {out['wall']['watched_ms']:.1f} ms/step, paused "
                  f"{out['wall']['paused_ms']:.1f}, ratio {out['wall']['ratio']:.3f} wall / {out['cpu']['ratio']:.3f} "
                  f"CPU" + (f"; eval forward {ev['watched_ms']:.2f} / {ev['paused_ms']:.2f} ms, ratio {ev['ratio']:.3f}"
                            if ev else "") + f"; paused hooks {out['paused_residual_us']:.0f} us", flush=True)
    print("\nmedians over every run's neighbour ratios (steady state; the range is the runs' own medians)")
    print(f"{'model':>14} | {'watched':>9} | {'paused':>9} | {'step ratio':>19} | {'CPU':>5} | {'eval ratio':>19} | "
          "load")
    results = {}
    for name, rs in runs.items():
        def pooled(part, key="ratios"):
            values = [v for run in rs if part in run for v in run[part][key]]
            return statistics.median(values) if values else None

        def spread(part):
            return f"{min(r[part]['ratio'] for r in rs):.3f}-{max(r[part]['ratio'] for r in rs):.3f}"

        res = {"watched_ms": statistics.median(r["wall"]["watched_ms"] for r in rs),
               "paused_ms": statistics.median(r["wall"]["paused_ms"] for r in rs),
               "ratio": pooled("wall"), "cpu_ratio": pooled("cpu"), "runs": rs,
               "eval_ratio": pooled("eval") if "eval" in rs[0] else None}
        results[name] = res
        ev = f"{res['eval_ratio']:.3f} ({spread('eval')})" if res["eval_ratio"] is not None else "-"
        print(f"{name:>14} | {res['watched_ms']:>6.1f} ms | {res['paused_ms']:>6.1f} ms | {res['ratio']:.3f} "
              f"({spread('wall')}) | {res['cpu_ratio']:.3f} | {ev:>19} | "
              f"{min(r['load'] for r in rs):.1f}-{max(r['load'] for r in rs):.1f}")
    if a.json:
        write_json(a.json, results)


def write_json(path: str, data) -> None:
    """--json: its folder made if missing (a relative path is the caller's folder's)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=1))


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
