"""What does `debug-nan run`'s recorder pay per recorded call to keep the autocast state and the dtypes?

    python scripts/bench_recorded_call.py [--calls 20000] [--repeats 7]

A loop of small torch calls (`a * b + c` on [8, 8] tensors, the size of a loss's scalars and targets) under the
recorder with an open tape, the way the script's code around its model is recorded, in four modes:
  plain        no recorder (the calls alone)
  recorded     the recorder as it is: each call's entry with its autocast state and its outputs' dtypes
  no_state     the same with the autocast read replaced by a constant (what the entry cost before it)
  autocast     `recorded` inside torch.autocast("cpu", dtype=torch.bfloat16) (the state's slow path: each device's
               dtype and the cache flag are read)
Modes alternate within each repeat, in an order that rotates; the figure is the median over the repeats of ns per
call. On a shared machine the whole-call modes swing by more than the state costs, so the state's read is also
timed alone (`autocast_state()`, outside and inside autocast, 100000 calls per repeat). No tensor value is read
by the state (no host sync on CUDA): it is a few C calls of torch's thread-local autocast flags.
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext

import torch

from debug_nan.drivers.run import tape as tape_module
from debug_nan.drivers.run.recorder import Recorder
from debug_nan.drivers.run.tape import Tape
from debug_nan.engine.session.precision import autocast_state


def _loop(calls: int, recorder: Recorder | None, region) -> float:
    a, b, c = torch.randn(8, 8), torch.randn(8, 8), torch.randn(8, 8)
    if recorder is not None:
        recorder.tape = Tape(first_form="single")
    with region:
        started = time.perf_counter()
        for _ in range(calls // 2):
            a * b + c
        seconds = time.perf_counter() - started
    if recorder is not None:
        recorder.tape = None
    return seconds / calls * 1e9


def _state(region, calls: int = 100000) -> float:
    with region:
        started = time.perf_counter()
        for _ in range(calls):
            autocast_state()
        return (time.perf_counter() - started) / calls * 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    recorder = Recorder()
    recorder.install()
    real = tape_module.autocast_state
    def plain():
        recorder.suspend()
        try:
            return _loop(args.calls, None, nullcontext())
        finally:
            recorder.resume()

    def no_state():
        tape_module.autocast_state = tuple
        try:
            return _loop(args.calls, recorder, nullcontext())
        finally:
            tape_module.autocast_state = real

    modes = {"plain": plain, "recorded": lambda: _loop(args.calls, recorder, nullcontext()), "no_state": no_state,
             "autocast": lambda: _loop(args.calls, recorder, torch.autocast("cpu", dtype=torch.bfloat16))}
    times: dict[str, list[float]] = {m: [] for m in (*modes, "state_off", "state_on")}
    try:
        for repeat in range(args.repeats + 1):  # (the first round is a warm-up)
            names = list(modes)
            for name in names[repeat % len(names):] + names[:repeat % len(names)]:
                times[name].append(modes[name]())
            times["state_off"].append(_state(nullcontext()))
            times["state_on"].append(_state(torch.autocast("cpu", dtype=torch.bfloat16)))
    finally:
        recorder.uninstall()
    median = {m: statistics.median(v[1:]) for m, v in times.items()}
    print(f"torch {torch.__version__}, {args.calls} calls x {args.repeats} repeats, ns per call (median):")
    for mode, ns in median.items():
        print(f"  {mode:9s} {ns:9.0f}")
    print(f"  autocast_state() alone: {median['state_off']:.0f} ns outside autocast "
          f"({median['state_off'] / median['recorded']:.2%} of a recorded call), {median['state_on']:.0f} ns inside it "
          f"({median['state_on'] / median['autocast']:.2%})")


if __name__ == "__main__":
    main()
