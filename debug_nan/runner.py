"""One job from settings to exit code: header, task, training with checks, summary, JSON report."""

from __future__ import annotations

import os
import platform
import re
import signal
import sys
import time
from pathlib import Path

import torch

import debug_nan
from debug_nan.errors import InputError
from debug_nan.report.history_table import check_plot_available, history_lines, plot_history
from debug_nan.report.log import Log
from debug_nan.report.summary import (EXIT_CODES, check_writable, report_dict, write_error_report, write_report,
                                      write_summary)
from debug_nan.settings import RunSettings


def header(log: Log, s: RunSettings, device: torch.device) -> None:
    log.rule(f"debug-nan {debug_nan.__version__}")
    gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    log(f"  torch {torch.__version__} | python {platform.python_version()} | device {device}{gpu}")
    data = "" if s.task else f" | batch {s.batch_size} | token limit {s.token_limit}"
    log(f"  task {s.task or 'built-in AAM pipeline'} | steps {s.max_steps} x {s.gradient_accumulation_steps} "
        f"micro-batch(es){data} | precision {s.precision} | lr {s.lr:g} | clip {s.max_grad_norm} | seed {s.seed}")


def oom_message(exc: BaseException, s: RunSettings, device: torch.device | None) -> str:
    """What failed (the allocation's size), the peak so far, and which option to lower."""
    text = str(exc)
    size = re.search(r"(?:Tried to allocate|you tried to allocate) ([\d.]+ ?\w+)", text)
    failed = f"an allocation of {size.group(1)} failed" if size else (text.splitlines()[0] if text else "out of memory")
    if device is not None and device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        total = torch.cuda.get_device_properties(device).total_memory / 2**30
        where = f"CUDA ran out of memory on {device}: {failed}; peak allocated {peak:.2f} GiB of {total:.1f} GiB."
    else:
        where = f"The CPU ran out of memory: {failed}."
    if s.task:
        advice = "lower the batch size or sequence length your task uses"
    else:
        advice = (f"the ASV encoder holds [batch x token limit x 151 x d_model] activations: lower --batch-size "
                  f"(now {s.batch_size}) or --token-limit (now {s.token_limit}), or bound the encoder with "
                  f"--asv-chunk-size (now {s.asv_chunk_size or 'off'}, e.g. 512)")
    return f"{where} To fit, {advice}."


def stop(message: str, log, s: RunSettings, main_rank: bool) -> None:
    """Bad usage or input before or outside the training loop: an error report where one was asked for (and its
    folder is writable), the one-paragraph message, exit 2."""
    from debug_nan.cli import fail

    if s.report and main_rank:
        try:
            check_writable(s.report, "--report")
            write_error_report(s.report, message, 2)
        except (InputError, OSError):
            pass
    fail(message, log)


def run_job(s: RunSettings, stream=None) -> int:
    """Run the job and return the process exit code."""
    from debug_nan.train.loop import Trainer, resolve_device

    from debug_nan.train import distributed

    started = time.perf_counter()
    log = device = trainer = None
    ctx = distributed.detect()
    main_rank = ctx is None or ctx.is_main
    try:
        if main_rank:
            check_writable(s.report, "--report")
            check_writable(s.plot, "--plot")
            check_plot_available(s.plot)
            log = Log(s.log, stream=stream)
        else:  # other ranks: a per-rank log beside the report (or in the current folder), nothing on stdout
            folder = Path(s.report).parent if s.report else Path(".")
            log = Log(str(folder / f"debug-nan-rank{ctx.rank}.log"), stream=open(os.devnull, "w"))
        device = distributed.init(ctx, s.device) if ctx else resolve_device(s.device, log)
        header(log, s, device)
        if ctx:
            log(f"  torchrun: rank {ctx.rank} of {ctx.world} (local rank {ctx.local_rank}), DistributedDataParallel, "
                f"{'NCCL' if device.type == 'cuda' else 'gloo'}; rank 0 writes the log and the report")
        if s.task:
            from debug_nan.train.task import load_task

            task = load_task(s.task, s)
        else:
            from debug_nan.train.aam_task import build_aam_task

            task = build_aam_task(s, log)
        trainer = Trainer(task, s, log, device, ctx)
        if s.bundle:
            trainer.bundle_dir = s.bundle_dir or (str(Path(s.report).parent) if s.report else ".")
        result = trainer.run()
    except InputError as exc:
        stop(str(exc), log, s, main_rank)
    except (torch.OutOfMemoryError, RuntimeError) as exc:
        from debug_nan.train.loop import is_out_of_memory

        if not is_out_of_memory(exc):
            raise
        stop(oom_message(exc, s, device), log, s, main_rank)
    except KeyboardInterrupt:
        from debug_nan.train.loop import RunResult

        if log is None:
            sys.exit(130)
        log("Interrupted (Ctrl-C) before training started.", "yellow")
        result = RunResult(status="clean", steps_run=0, interrupted=True)
    elapsed = time.perf_counter() - started
    code = result.exit_code or (130 if result.interrupted else EXIT_CODES[result.status])
    if main_rank:
        write_outputs(log, result, s, trainer, device, elapsed)
    else:
        write_summary(log, result, elapsed)
        log.close()
    if ctx is not None:
        # rank 0 has written the report; now every rank leaves together. torchrun SIGTERMs the other workers as
        # soon as one exits non-zero, so from here on a SIGTERM exits with this rank's own code, and the process
        # leaves without the interpreter's slow teardown (during which the default SIGTERM action is back)
        signal.signal(signal.SIGTERM, lambda *_: os._exit(code))
        distributed.finish()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def write_outputs(log, result, s: RunSettings, trainer, device, elapsed: float) -> None:
    """The history table (and plot), the summary (the last block of the log) and the JSON report."""
    if result.history.steps:
        log()
        log.rule(f"HISTORY (per layer, {len(result.history.steps)} step(s))")
        for line in history_lines(result.history, trainer.model):
            log(line)
        if s.plot:
            plot_history(result.history, trainer.model, s.plot)
            log(f"  heat map written to {s.plot}")
    write_summary(log, result, elapsed)
    data = report_dict(result, s, device, elapsed)
    if s.report:
        write_report(s.report, data)
        log(f"JSON report written to {s.report}")
    log.close()


def run_replay(bundle: str, device_spec: str, report: str | None, log_path: str | None) -> int:
    """`debug-nan replay BUNDLE`: the same finding again, from the bundle alone (and the --task file)."""
    from debug_nan.cli import fail
    from debug_nan.report.bundle import replay_bundle, same_origin
    from debug_nan.train.loop import RunResult

    started = time.perf_counter()
    log = None
    try:
        check_writable(report, "--report")
        log = Log(log_path)
        log.rule(f"debug-nan {debug_nan.__version__} replay {bundle}")
        finding, data, trainer = replay_bundle(bundle, device_spec, log)
    except InputError as exc:
        fail(str(exc), log)
    result = RunResult(status="nonfinite" if finding else "clean", steps_run=0, finding=finding,
                       findings=[finding] if finding else [])
    if finding is not None:
        same = same_origin(data["finding"], finding)
        result.notes.append("Same origin as recorded in the bundle." if same else
                            f"The recorded origin was {data['finding']['module']} {data['finding']['op']} "
                            f"({data['finding']['cause']}); the replay differs (non-determinism or another "
                            f"device).")
    else:
        result.notes.append("The replay did not reproduce a non-finite value.")
    elapsed = time.perf_counter() - started
    write_summary(log, result, elapsed)
    if report:
        settings = RunSettings(**{**data["settings"], "device": device_spec})
        write_report(report, {**report_dict(result, settings, trainer.device, elapsed), "replay_of": bundle})
        log(f"JSON report written to {report}")
    log.close()
    return EXIT_CODES[result.status]
