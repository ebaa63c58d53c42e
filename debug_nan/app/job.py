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
from debug_nan.aam.sizes import check_activation_memory, oom_advice
from debug_nan.aam.task import build_aam_task
from debug_nan.drivers.task import load_task
from debug_nan.drivers.trainer.device import resolve_device
from debug_nan.drivers.trainer.loop import Trainer
from debug_nan.engine.replay.driver import is_out_of_memory
from debug_nan.engine.session import distributed
from debug_nan.engine.session.result import RunResult
from debug_nan.errors import InputError, describe_exception
from debug_nan.presentation.bundle import write_bundle
from debug_nan.presentation.history_plot import check_plot_available
from debug_nan.presentation.log import Log
from debug_nan.presentation.outputs import OutputWriteError, check_output_paths, check_writable, job_inputs, job_outputs
from debug_nan.presentation.step_line import StepLines
from debug_nan.presentation.pipeline import OutputOptions, present
from debug_nan.presentation.summary import exit_code, write_summary
from debug_nan.presentation.tensorboard import check_tensorboard
from debug_nan.process.interrupts import interrupt_code, interrupt_name
from debug_nan.settings import OutputSettings
from debug_nan.app.job_settings import JobSettings


def header(log: Log, s: JobSettings, device: torch.device) -> None:
    log.rule(f"debug-nan {debug_nan.__version__}")
    gpu = f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""
    log(f"  torch {torch.__version__} | python {platform.python_version()} | device {device}{gpu}")
    t = s.train
    data = "" if t.task else f" | batch {s.aam.data.batch_size} | token limit {s.aam.data.token_limit}"
    log(f"  task {t.task or 'built-in AAM pipeline'} | steps {t.max_steps} x {t.gradient_accumulation_steps} "
        f"micro-batch(es){data} | precision {t.precision} | seed {t.seed}")


def oom_message(exc: BaseException, s: JobSettings, device: torch.device | None) -> str:
    """What failed (the allocation's size), the peak so far, and what to lower: the built-in task's own sizes and
    options (aam/sizes.py), or a --task's batch and sequence length."""
    text = str(exc)
    size = re.search(r"(?:Tried to allocate|you tried to allocate) ([\d.]+ ?\w+)", text)
    failed = f"an allocation of {size.group(1)} failed" if size else (text.splitlines()[0] if text else "out of memory")
    if device is not None and device.type == "cuda":
        peak = torch.cuda.max_memory_allocated(device) / 2**30
        total = torch.cuda.get_device_properties(device).total_memory / 2**30
        where = f"CUDA ran out of memory on {device}: {failed}; peak allocated {peak:.2f} GiB of {total:.1f} GiB."
    else:
        where = f"The CPU ran out of memory: {failed}."
    if s.train.task:
        return f"{where} To fit, lower the batch size or sequence length your task uses."
    return f"{where} {oom_advice(s.aam, s.train.precision, size.group(1) if size else None)}"


def rank_log_path(o: OutputSettings, rank: int) -> str:
    return str((Path(o.report).parent if o.report else Path(".")) / f"debug-nan-rank{rank}.log")


def check_outputs(s: JobSettings, config: str | None, ctx) -> None:
    """Before anything is opened for writing: no output is an input or another output; each can be written."""
    o = s.outputs
    outputs = job_outputs(s.to_dict())
    if ctx is not None:
        outputs.update({f"rank {r}'s log": rank_log_path(o, r) for r in range(1, ctx.world)})
    check_output_paths(outputs, job_inputs(s.to_dict(), config), o.bundle_folder() if o.bundle else None)
    check_writable(o.report, "--report")
    check_writable(o.plot, "--plot")
    check_plot_available(o.plot)
    check_tensorboard(o.tensorboard)


def run_job(s: JobSettings, stream=None, config: str | None = None) -> int:
    """Run the job and return the process exit code (InputError: bad usage or input, for the cli; OutputWriteError:
    the run ended but an output could not be written). `config`: the --config file, an input never written."""
    started = time.perf_counter()
    log = device = trainer = None
    ctx = distributed.detect()
    main_rank = ctx is None or ctx.is_main
    try:
        if main_rank:
            check_outputs(s, config, ctx)
            log = Log(s.outputs.log, stream=stream)
        else:  # other ranks: a per-rank log beside the report (or in the current folder), nothing on stdout
            log = Log(rank_log_path(s.outputs, ctx.rank), stream=open(os.devnull, "w"))
        try:
            device = distributed.init(ctx, s.train.device) if ctx else resolve_device(s.train.device, log)
            if not s.train.task:
                check_activation_memory(s.aam, s.train.precision, device)
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
    except KeyboardInterrupt as exc:
        if log is None:  # before the log opened: the cli writes the interrupted report
            exc.before_log = True
            raise
        log(f"Interrupted ({interrupt_name(exc)}) before training started.", "yellow")
        result = RunResult(status="clean", steps_run=0, interrupted=True)
    if result.interrupted and result.exit_code is None:
        result.exit_code = interrupt_code()
    elapsed = time.perf_counter() - started
    if main_rank:
        return write_outputs(log, result, s, trainer, device, elapsed)
    write_summary(log, result, elapsed, interrupt_name())
    log.close()
    return exit_code(result)


def build_trainer(s: JobSettings, log: Log, device: torch.device, ctx) -> Trainer:
    """The header, the task (--task, or the built-in pipeline), and the Trainer with its step lines and bundles.
    Under torchrun every rank learns whether any rank failed to build the task before DDP's first collective."""
    header(log, s, device)
    if ctx:
        log(f"  torchrun: rank {ctx.rank} of {ctx.world} (local rank {ctx.local_rank}), "
            f"{'FSDP2 (--fsdp)' if s.train.fsdp else 'DistributedDataParallel'}, "
            f"{'NCCL' if device.type == 'cuda' else 'gloo'}; rank 0 writes the log and the report")
    failure = None
    try:
        task = load_task(s.train.task, s.for_task()) if s.train.task else build_aam_task(s.aam, s.train, log)
    except (InputError, KeyboardInterrupt) as exc:
        if ctx is None:
            raise
        failure = exc
    if ctx is not None:
        distributed.agree_on_setup(ctx, device, failure)  # raises on every rank when any rank failed
    try:
        trainer = Trainer(task, s, log, device, ctx)
    except (Exception, KeyboardInterrupt) as exc:  # under torchrun every rank must hear of it
        if ctx is None or isinstance(exc, distributed.SetupFailedOnARank):
            raise
        # the ranks that got through wait in the Trainer's setup agreement, before DDP's first collective
        distributed.agree_on_setup(ctx, device, _setup_failure(exc, s, device))
        raise
    log(f"  {trainer.recipe.line()}")
    if trainer.reducer is not None:
        log(f"  gradients averaged by {trainer.reducer.describe()}")
    trainer.observer = StepLines(log, trainer.first_step + s.train.max_steps, s.train.gradient_accumulation_steps,
                                 trainer.recipe.max_grad_norm, quiet=s.outputs.quiet)
    if s.outputs.bundle:
        folder = s.outputs.bundle_folder()
        trainer.save_repro = lambda state: str(write_bundle(folder, state))
    return trainer


def _setup_failure(exc: BaseException, s: JobSettings, device: torch.device) -> BaseException:
    """A rank's failure to build the Trainer, as the message every rank reports."""
    if isinstance(exc, (InputError, KeyboardInterrupt)):
        return exc
    if is_out_of_memory(exc):
        return InputError(oom_message(exc, s, device))
    return InputError(f"building the trainer: {describe_exception(exc)}")


def write_outputs(log, result, s: JobSettings, trainer, device, elapsed: float) -> int:
    """Every output through the one pipeline (presentation/pipeline.py), then the real exit code; raises
    OutputWriteError (exit 2) after the summary when an output could not be written."""
    o = s.outputs
    options = OutputOptions(o.report, o.plot, o.tensorboard, o.history, o.quiet)
    presented = present(log, result, trainer.model if trainer is not None else None, options, settings=s.to_dict(),
                        device=device, elapsed=elapsed, interrupted_by=interrupt_name())
    if not presented.ok:
        raise OutputWriteError(presented.why)
    return exit_code(result)
