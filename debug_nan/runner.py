"""One job from settings to exit code: header, task, training with checks, summary, JSON report.

run_job returns the process exit code. Bad usage or bad input (an InputError, or an out-of-memory error outside
the training loop, turned into one that names the option to lower) propagates to the cli, which prints it,
writes the error report and exits 2.
"""

from __future__ import annotations

import os
import platform
import re
import time
from pathlib import Path

import torch

import debug_nan
from debug_nan.checks.driver import is_out_of_memory
from debug_nan.errors import InputError
from debug_nan.report.bundle import write_bundle
from debug_nan.report.history_table import check_plot_available, history_lines, plot_history
from debug_nan.report.log import Log
from debug_nan.report.step_line import StepLines
from debug_nan.report.summary import EXIT_CODES, check_writable, report_dict, write_report, write_summary
from debug_nan.settings import RunSettings
from debug_nan.train import distributed
from debug_nan.train.aam_task import build_aam_task
from debug_nan.train.device import resolve_device
from debug_nan.train.loop import Trainer
from debug_nan.train.outcome import RunResult
from debug_nan.train.task import load_task


def header(log: Log, s: RunSettings, device: torch.device) -> None:
    log.rule(f"debug-nan {debug_nan.__version__}")
    gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    log(f"  torch {torch.__version__} | python {platform.python_version()} | device {device}{gpu}")
    data = "" if s.task else f" | batch {s.batch_size} | token limit {s.token_limit}"
    log(f"  task {s.task or 'built-in AAM pipeline'} | steps {s.max_steps} x {s.gradient_accumulation_steps} "
        f"micro-batch(es){data} | precision {s.precision} | seed {s.seed}")


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


def run_job(s: RunSettings, stream=None) -> int:
    """Run the job and return the process exit code (InputError: bad usage or input, for the cli)."""
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
        try:
            device = distributed.init(ctx, s.device) if ctx else resolve_device(s.device, log)
            trainer = build_trainer(s, log, device, ctx)
            result = trainer.run()
        except (torch.OutOfMemoryError, MemoryError, RuntimeError) as exc:
            if not is_out_of_memory(exc):
                raise
            raise InputError(oom_message(exc, s, device)) from None
    except InputError as exc:
        if log is not None:
            log.record_error(str(exc))
            log.close()
        raise
    except KeyboardInterrupt:
        if log is None:
            return 130
        log("Interrupted (Ctrl-C) before training started.", "yellow")
        result = RunResult(status="clean", steps_run=0, interrupted=True)
    elapsed = time.perf_counter() - started
    code = result.exit_code or (130 if result.interrupted else EXIT_CODES[result.status])
    if main_rank:
        write_outputs(log, result, s, trainer, device, elapsed)
    else:
        write_summary(log, result, elapsed)
        log.close()
    return code


def build_trainer(s: RunSettings, log: Log, device: torch.device, ctx) -> Trainer:
    """The header, the task (--task, or the built-in pipeline), and the Trainer with its step lines and bundles."""
    header(log, s, device)
    if ctx:
        log(f"  torchrun: rank {ctx.rank} of {ctx.world} (local rank {ctx.local_rank}), DistributedDataParallel, "
            f"{'NCCL' if device.type == 'cuda' else 'gloo'}; rank 0 writes the log and the report")
    task = load_task(s.task, s) if s.task else build_aam_task(s, log)
    trainer = Trainer(task, s, log, device, ctx)
    log(f"  {trainer.recipe.line()}")
    trainer.observer = StepLines(log, s.max_steps, s.gradient_accumulation_steps, trainer.recipe.max_grad_norm)
    if s.bundle:
        folder = s.bundle_dir or (str(Path(s.report).parent) if s.report else ".")
        trainer.save_repro = lambda state: str(write_bundle(folder, state))
    return trainer


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
