"""What do the checks cost? One process, one model, the same batch, every mode timed side by side.

    python scripts/bench_overhead.py --device cpu --json out.json           # AAM model, configs/bench-cpu.toml
    python scripts/bench_overhead.py --device cpu --model deep               # 24 narrow blocks (295 modules)
    python scripts/bench_overhead.py --device cpu --model gpt2               # GPT-2-like, 6 blocks, d 384
    python scripts/bench_overhead.py --device cuda --config configs/aam.toml # the default AAM size

Models (--model): `aam` is the built-in AAM pipeline at --config (default configs/bench-cpu.toml); `deep` and
`gpt2` are the built-in language models of scripts/bench_models.py (one fixed batch of random tokens).

Modes, each a full training step (forward, loss, backward, clipping if the settings ask, AdamW step, schedule):
  plain           no checks at all (and no hook registered on any module)
  watch           the default run's step (Trainer.train_step): snapshot, the watch's on-device checks of batch,
                  module outputs, loss, gradients, parameters, one host sync per micro-batch, the history
  watch_only      `watch` without its snapshot (the snapshot's save() skipped): the checks' own cost
  watch_all       `watch` measuring every module output in every step, as the first 16 steps of a run do (after
                  them the CPU measures the outputs on a stride, engine/session/output_schedule.py: `watch` and
                  `monitor` are timed there, after a pre-roll of 16 untimed steps)
  monitor         the plain step inside `debug_nan.Monitor.step()` (the Python API's entry point: the same step
                  session as `watch`, its optimizer hook reading the parameters after the step)
  snapshot        plain + the snapshot the watch takes before every step (its share of `watch`, for reference)
  trace           the op-level tracer (what only the replayed micro-batch pays)
  detect_anomaly  torch.autograd.detect_anomaly() around a plain step
  naive_hooks     plain + a forward hook on every module doing `isfinite(out).all().item()` (a host sync each)
Modes alternate within every repeat (drift hits all alike), in an order that rotates, after warm-up. `x plain`
is the median over the repeats of each repeat's time divided by the same repeat's plain time; `CPU x plain` is the same
with the CPU time of this process (all its threads): steadier than wall time on a machine that other processes share,
though it under-weights single-threaded extra work next to a multi-threaded step. On CUDA the device is synchronised
around every step, and the host syncs of one watch step are counted with torch.cuda.set_sync_debug_mode("warn").
On a CPU shared with other busy processes, spin-waiting OpenMP threads make single steps up to 10x slower at
random: there, OMP_WAIT_POLICY=PASSIVE steadies the timings, but every parallel op then pays a thread wake-up
(~30 us on 2 cores), which inflates the cost of many small reductions (the watch's, and the model's own): compare
runs under the same policy only. The policy in force is printed and written to the JSON.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_models import PRESETS, build_lm_task  # noqa: E402

import debug_nan  # noqa: E402
from debug_nan.aam.task import build_aam_task  # noqa: E402
from debug_nan.drivers.trainer.loop import Trainer, resolve_device  # noqa: E402
from debug_nan.engine.session.output_schedule import WARM_STEPS, OutputSchedule  # noqa: E402
from debug_nan.engine.stats import flat_tensors, move_to  # noqa: E402
from debug_nan.engine.trace.tracer import Tracer  # noqa: E402
from debug_nan.presentation.log import Log  # noqa: E402
from debug_nan.app.job_settings import build_settings  # noqa: E402

MODES = ("plain", "watch", "watch_only", "watch_all", "monitor", "snapshot", "trace", "detect_anomaly", "naive_hooks")
DEFAULT_MODES = ("plain", "watch", "watch_only", "watch_all", "monitor", "snapshot", "detect_anomaly", "naive_hooks",
                 "trace")


@contextlib.contextmanager
def chdir(path):
    """contextlib.chdir, which Python 3.10 lacks."""
    before = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(before)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def plain_step(t: Trainer, batch) -> None:
    t.optimizer.zero_grad(set_to_none=True)
    loss, _ = t.compute_loss(move_to(batch, t.device))
    t.backward(loss)
    if t.s.train.max_grad_norm:  # as the run does: clipping only when asked for
        torch.nn.utils.clip_grad_norm_(t.model.parameters(), t.s.train.max_grad_norm)
    t.optimizer.step()
    t.step_schedule()


def monitored_step(t: Trainer, monitor, batch) -> None:
    """plain_step as a user's loop under debug_nan.Monitor: the micro-batch inside step(), the update after it."""
    t.optimizer.zero_grad(set_to_none=True)
    with monitor.step(batch) as watched:
        loss, _ = t.compute_loss(move_to(batch, t.device))
        watched.watch_loss(loss)
        t.backward(loss)
    if t.s.train.max_grad_norm:
        torch.nn.utils.clip_grad_norm_(t.model.parameters(), t.s.train.max_grad_norm)
    t.optimizer.step()
    t.step_schedule()


def snapshot_step(t: Trainer, batch) -> None:
    t.snapshot.stage()
    t.snapshot.save()
    plain_step(t, batch)


def traced_step(t: Trainer, batch) -> None:
    with Tracer(t.model):
        plain_step(t, batch)


def anomaly_step(t: Trainer, batch) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autograd.detect_anomaly():
            plain_step(t, batch)


def naive_hook(module, inputs, output) -> None:
    """What a user might write: one isfinite().all() and one host sync per module output."""
    for _, t in flat_tensors(output):
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            raise FloatingPointError(f"non-finite output of {type(module).__name__}")


def build_trainer(args) -> tuple[Trainer, object, dict]:
    """(trainer, its one fixed batch, the model description for the header and the JSON)."""
    config = args.config if args.model == "aam" else None
    settings = build_settings(config, {"device": args.device, "max_steps": 10**9})
    quiet = Log(stream=io.StringIO())
    device = resolve_device(settings.train.device, quiet)
    if args.model == "aam":
        # synthetic data: the default ./data of an empty folder (an explicit --data-dir must exist)
        with tempfile.TemporaryDirectory() as empty, chdir(empty):
            task = build_aam_task(settings.aam, settings.train, quiet)
        flat = settings.to_dict()  # (the settings' flat record: the keys by their option names)
        desc = {"file": Path(args.config).name, **{k: flat[k] for k in (
            "token_limit", "batch_size", "d_model", "heads", "asv_layers", "sample_layers", "encoder_layers",
            "precision")}}
    else:
        task = build_lm_task(args.model, settings.train.seed)
        desc = dict(vars(PRESETS[args.model]))
    trainer = Trainer(task, settings, quiet, device)
    desc = {"model": args.model, **desc, "modules": sum(1 for _ in trainer.model.modules()),
            "parameters": sum(p.numel() for p in trainer.model.parameters())}
    return trainer, next(iter(task.batches)), desc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--model", choices=("aam", *PRESETS), default="aam")
    ap.add_argument("--config", default=str(REPO / "configs" / "bench-cpu.toml"), help="the AAM size (--model aam)")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"a comma list of {', '.join(MODES)}")
    ap.add_argument("--split", action="store_true", help="also time each piece of the watch alone (min of many)")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's own choice)")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    modes = [m for m in args.modes.split(",") if m in MODES]
    if "plain" not in modes:
        modes.insert(0, "plain")
    trainer, batch, desc = build_trainer(args)
    device, watch, log = trainer.device, trainer.watch, trainer.log
    watch.close()  # hooks only while the watch mode runs: a registered hook slows every module call
    monitor = debug_nan.Monitor(trainer.model, lambda model, b: trainer.compute_loss(move_to(b, device))[0],
                                trainer.optimizer, max_grad_norm=trainer.s.train.max_grad_norm)
    monitor.close()  # its module and optimizer hooks, too, only while the monitor mode runs

    steps = itertools.count(1)  # every watch mode's step is the run's next step

    def watch_step(i: int) -> None:
        log.stream.seek(0)
        log.stream.truncate()
        finding = trainer.train_step(next(steps), itertools.repeat(batch))
        assert finding is None, finding

    def watch_only_step(i: int) -> None:
        snapshot = trainer.snapshot
        snapshot.stage, snapshot.save = (lambda: None), (lambda: None)  # nothing is replayed here (watch_step)
        try:
            watch_step(i)
        finally:
            del snapshot.stage, snapshot.save

    def watch_all_step(i: int) -> None:
        session = trainer.session
        schedule, session.outputs = session.outputs, OutputSchedule(1, adaptive=False)
        try:
            watch_step(i)
        finally:
            session.outputs = schedule

    step_fns = {
        "plain": lambda i: plain_step(trainer, batch),
        "watch": watch_step,
        "watch_only": watch_only_step,
        "watch_all": watch_all_step,
        "monitor": lambda i: monitored_step(trainer, monitor, batch),
        "snapshot": lambda i: snapshot_step(trainer, batch),
        "trace": lambda i: traced_step(trainer, batch),
        "detect_anomaly": lambda i: anomaly_step(trainer, batch),
        "naive_hooks": lambda i: plain_step(trainer, batch),
    }
    # past the first WARM_STEPS steps, which measure every module output: the steady state, as a long run has it
    for mode in {"watch", "watch_only", "monitor"} & set(modes):
        (watch.attach if mode != "monitor" else monitor.attach)()
        for i in range(WARM_STEPS):
            step_fns[mode](i)
        (watch.close if mode != "monitor" else monitor.close)()
    times: dict[str, list[float]] = {m: [] for m in modes}
    cpu_times: dict[str, list[float]] = {m: [] for m in modes}
    for rep in range(args.warmup + args.repeats):
        # the order rotates from repeat to repeat: a step runs faster or slower after some modes (caches, the
        # OpenMP threads' state), which must not favour one mode
        for mode in modes[rep % len(modes):] + modes[:rep % len(modes)]:
            if mode.startswith("watch"):
                watch.attach()
            if mode == "monitor":
                monitor.attach()
            naive = [m.register_forward_hook(naive_hook) for m in trainer.model.modules()] \
                if mode == "naive_hooks" else []
            sync(device)
            start, cpu_start = time.perf_counter(), time.process_time()
            step_fns[mode](rep)
            sync(device)
            elapsed, cpu_elapsed = time.perf_counter() - start, time.process_time() - cpu_start
            if rep >= args.warmup:
                times[mode].append(elapsed)
                cpu_times[mode].append(cpu_elapsed)
            for h in naive:
                h.remove()
            if mode.startswith("watch"):
                watch.close()  # the step's parameter check is read at the next watch step's sync, as in a run
            if mode == "monitor":
                monitor.close()
    ms = {m: 1000 * statistics.median(v) for m, v in times.items()}
    ratio = paired_ratios(times)
    cpu_ratio = paired_ratios(cpu_times)
    syncs = count_cuda_syncs(watch, watch_step) if device.type == "cuda" and "watch" in modes else None
    plain_s = min((times if device.type == "cuda" else cpu_times)["plain"])  # the clock split_watch uses
    split = split_watch(trainer, batch, plain_s, max(3, args.repeats)) if args.split else None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu ({torch.get_num_threads()} threads)"
    print(f"device {name} | OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', 'unset')} | model {desc} | "
          f"{args.repeats} repeats after {args.warmup} warm-up")
    print(f"{'mode':<16}{'ms/step':>10}{'x plain':>10}{'CPU x plain':>13}   (ms: median wall time; x plain: median "
          f"of per-repeat paired ratios, of wall time and of this process's CPU time)")
    for m in modes:
        print(f"{m:<16}{ms[m]:>10.1f}{ratio[m]:>10.3f}{cpu_ratio[m]:>13.3f}")
    if syncs is not None:
        print(f"host syncs in one watch step (torch.cuda.set_sync_debug_mode): {syncs} (one per micro-batch)")
    if args.json_path:
        out = {"device": name, "model": args.model, "config": desc, "ms_per_step": ms, "ratio_to_plain": ratio,
               "cpu_ratio_to_plain": cpu_ratio,
               "cpu_samples_ms": {m: [1000 * x for x in v] for m, v in cpu_times.items()},
               "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
               "repeats": args.repeats, "warmup": args.warmup, "torch": torch.__version__,
               "host_syncs_per_watch_step": syncs, "split_ms": split,
               "samples_ms": {m: [1000 * x for x in v] for m, v in times.items()}}
        Path(args.json_path).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json_path}")


def paired_ratios(times: dict[str, list[float]]) -> dict[str, float]:
    """Per mode: the median over the repeats of (this repeat's time / the same repeat's plain time)."""
    return {m: statistics.median(a / b for a, b in zip(v, times["plain"])) for m, v in times.items()}


def split_watch(t: Trainer, batch, plain_s: float, repeats: int) -> dict[str, float]:
    """Each piece of a watch step alone, min over `repeats` in ms, and its share of the fastest plain step. On
    the CPU the pieces are timed in this process's CPU time (all threads), which other busy processes disturb
    far less than wall time. The forward hooks: a forward + loss with and without them, alternated."""
    w, device = t.watch, t.device
    data = move_to(batch, device)
    clock = time.perf_counter if device.type == "cuda" else time.process_time

    def timed(fn) -> float:
        sync(device)
        start = clock()
        fn()
        sync(device)
        return 1000 * (clock() - start)

    def best(fn) -> float:
        fn()
        return min(timed(fn) for _ in range(repeats))

    w.measure_outputs = True  # (whatever the run's output schedule chose for its last step)

    def forward(hooked: bool):
        (w.attach if hooked else w.close)()
        t.compute_loss(data)
        w.discard()

    pairs = [(timed(lambda: forward(True)), timed(lambda: forward(False))) for _ in range(repeats + 1)][1:]
    hooked, bare = min(p[0] for p in pairs), min(p[1] for p in pairs)
    w.attach()
    loss, parts = t.compute_loss(data)
    loss.backward()
    t.optimizer.step()
    pieces = {"forward hooks (module outputs)": hooked - bare,
              "gradients (watch_grads)": best(lambda: (w.watch_grads(), w.discard())),
              "parameters + optimizer state (watch_params)": best(lambda: (w.watch_params(), w.discard()))}

    def one_sync():
        w.watch_params()
        w.watch_batch(data)
        with torch.no_grad():
            w.watch_loss(*t.compute_loss(data))
        w.watch_grads()
        start = clock()
        t.history.add_micro(t.history.begin(0), w.sync(), True)  # (one process: nothing to agree)
        return clock() - start

    pieces["sync + history"] = 1000 * min(one_sync() for _ in range(repeats))
    t.history.steps.clear()
    pieces["snapshot (not the watch's)"] = best(lambda: (t.snapshot.stage(), t.snapshot.save()))
    w.close()
    print(f"split of the watch, each piece alone (min of {repeats}, {'wall' if device.type == 'cuda' else 'CPU'} "
          f"time), against the fastest plain step ({1000 * plain_s:.1f} ms, same clock):")
    for name, ms in pieces.items():
        print(f"  {name:<46}{ms:>8.2f} ms {100 * ms / (1000 * plain_s):>6.1f} %")
    return pieces


def count_cuda_syncs(watch, watch_step) -> int:
    watch.attach()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            watch_step(10**6)
        finally:
            torch.cuda.set_sync_debug_mode(0)
    watch.sync()
    watch.close()
    return sum("synchroniz" in str(w.message).lower() for w in caught)


if __name__ == "__main__":
    main()
