"""`debug-nan replay BUNDLE`: the same finding again, from a repro bundle alone (and its --task file's text).

Rebuilds the task (the built-in model from the bundle's settings, or the --task from the file's text stored in the
bundle, run under the file's path; the log says when the file on disk differs) around the
bundle's micro-batches, loads the state from just before the failing step, and replays the failing micro-batch
(or optimizer step) under the op-level tracer.
"""

from __future__ import annotations

import re
import time

import torch

import debug_nan
from debug_nan.aam.task import build_aam_model_task
from debug_nan.app.job_settings import LAYOUT, JobSettings
from debug_nan.drivers.run.bundle import replay_script_bundle
from debug_nan.drivers.task import load_task
from debug_nan.drivers.trainer.device import resolve_device
from debug_nan.drivers.trainer.loop import Trainer
from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.replay.driver import StepInputs, TaskFailure
from debug_nan.engine.replay.trip import Trip
from debug_nan.engine.session.result import RunResult
from debug_nan.engine.watch.watch import Check
from debug_nan.errors import InputError, describe_exception
from debug_nan.presentation.bundle import read_bundle, same_origin, task_file_state
from debug_nan.presentation.log import Log
from debug_nan.presentation.outputs import OutputWriteError, check_output_paths, check_writable, task_file
from debug_nan.presentation.pipeline import OutputOptions, present
from debug_nan.presentation.summary import exit_code
from debug_nan.process.interrupts import interrupt_code, interrupt_name


def replay_script(b: dict, device_spec: str, log) -> tuple[Finding | None, torch.device]:
    """A bundle `debug-nan run` wrote: the script's own objects and recorded code, replayed (drivers/run/bundle.py).
    -> (finding, device)."""
    device = resolve_device(device_spec, log)
    log(f"Replaying step {b['step']}, micro-batch {b['micro']} of a bundle `debug-nan run` wrote on {b.get('device')} "
        f"(torch {b.get('torch')}) on {device}: the script's model, optimizer and recorded code, from the bundle.")
    return replay_script_bundle(b, device, log), device


def bundle_settings(b: dict, path: str, device_spec: str) -> JobSettings:
    """The settings a bundle of the built-in task, a --task or a callback recorded (flat, by the options' names:
    those of the one flat settings class before the components, the same names), on this device, writing no
    report or log of the run's. A name this debug-nan does not know (a newer one wrote it) or a value of the wrong
    type is one paragraph, exit 2."""
    recorded = b["settings"]
    unknown = sorted(set(recorded) - set(LAYOUT.places)) if isinstance(recorded, dict) else None
    if unknown:  # a bundle of the same format from a newer debug-nan, with settings this one does not have
        raise InputError(f"Bundle {path} was written by a newer debug-nan: its settings {', '.join(unknown)} are "
                         f"unknown to debug-nan {debug_nan.__version__}. Replay it with the debug-nan that wrote "
                         f"it, or upgrade.")
    where = f"Bundle {path}'s settings"
    if unknown is None:
        raise InputError(f"{where} are not a table of settings (got {type(recorded).__name__}): the bundle is "
                         f"damaged or not debug-nan's. Replay it with the debug-nan that wrote it.")
    values = {name: LAYOUT.check_value(name, value, where) for name, value in recorded.items()}
    # a setting the run did not know (a callback's seed, its max_steps) is None: at its default here, where only
    # the model's building before the bundle's state is loaded reads it
    known = {name: value for name, value in values.items() if value is not None}
    return JobSettings.from_flat({**known, "device": device_spec, "report": None, "log": None})


def replay_bundle(b: dict, path: str, device_spec: str, log) -> tuple[Finding | None, Trainer, list[str]]:
    """Rebuild the task and state from a read bundle `b` and replay its micro-batch -> (finding, trainer, notes).
    A --task file runs from the text stored in the bundle (the run as it was), whatever the file on disk is now."""
    settings = bundle_settings(b, path, device_spec)
    device = resolve_device(settings.train.device, log)
    notes = []
    if b["task"]:
        state = task_file_state(b)
        if state:
            log(f"  task {b['task']}: {state}", "yellow" if "DIFFERS" in state else None)
            notes.append(state[0].upper() + state[1:])
        task = load_task(b["task"], settings.for_task(), source=b.get("task_source"))
        task.batches = b["batches"]
    else:
        task = build_aam_model_task(settings.aam, settings.train.seed, b["batches"])
    trainer = Trainer(task, settings, log, device)
    snapshot = trainer.snapshot
    try:
        snapshot.load_state_dicts(b)
    except (KeyError, RuntimeError, ValueError) as exc:
        raise InputError(f"Bundle {path}: its saved state does not fit the model the task builds now "
                         f"({describe_exception(exc)}).") from None
    inputs = StepInputs(step=b["step"], batches=b["batches"], rng=b["rng"], snapshot=snapshot)
    check = Check(**b["check"]) if b["check"] else None
    log(f"Replaying step {b['step']}, micro-batch {b['micro']} of a bundle written on {b.get('device')} "
        f"(torch {b.get('torch')}) on {device}.")
    finding = trainer.pinpointer.pinpoint(Trip(inputs, b["micro"], check, None, b["optimizer_phase"]))
    return finding, trainer, notes


def interrupted_result(b: dict, exc: BaseException, notes: list[str]) -> RunResult:
    """An interrupted replay confirmed nothing: the status is the bundle's recorded finding (never CLEAN for a
    NaN bundle), said to be the recorded one."""
    try:
        recorded = Finding(**b["finding"])
    except (TypeError, ValueError):  # a finding of another layout or vocabulary (a newer debug-nan): the words alone
        recorded = None
    notes = [*notes, f"The replay was interrupted ({interrupt_name(exc)}) before it finished: the finding above is "
                     f"the one the bundle recorded, not confirmed by this replay."]
    return RunResult(status="nonfinite" if recorded else "error", steps_run=0, finding=recorded,
                     findings=[recorded] if recorded else [], interrupted=True, exit_code=interrupt_code(exc),
                     notes=notes, error=None if recorded else "The replay was interrupted before it finished.")


def check_replay_outputs(bundle: str, report: str | None, log_path: str | None, data: dict | None) -> None:
    """No output over the bundle, its task file, or the other output; the report's folder writable."""
    inputs = {"bundle": bundle}
    task = task_file(data.get("task")) if data else None
    if task:
        inputs["bundle's --task file"] = task
    check_output_paths({"--report": report, "--log": log_path}, inputs)
    check_writable(report, "--report")


def run_replay(bundle: str, device_spec: str, report: str | None, log_path: str | None, trust: bool = False) -> int:
    """Replay, summary, JSON report -> the exit code. Bad input (and any failure of the replay itself) raises
    InputError (the cli exits 2 with the error report); an interrupt still writes the summary and the report.
    `trust`: replay a bundle whose signature is missing, wrong or another's (it may run code stored in it)."""
    started = time.perf_counter()
    check_replay_outputs(bundle, report, log_path, None)
    data = read_bundle(bundle, trust)
    check_replay_outputs(bundle, report, log_path, data)
    log = Log(log_path)
    trainer, notes, device = None, [], None
    try:
        log.rule(f"debug-nan {debug_nan.__version__} replay {bundle}")
        if data.get("script") is not None:
            finding, device = replay_script(data, device_spec, log)
        else:
            finding, trainer, notes = replay_bundle(data, bundle, device_spec, log)
            device = trainer.device
        result = RunResult(status="nonfinite" if finding else "clean", steps_run=0, finding=finding,
                           findings=[finding] if finding else [], notes=notes)
    except TaskFailure as failure:  # the task's (or script's) code raised in the replay, every value finite
        log(f"The replay raised: {failure}", "red")
        finding = None
        result = RunResult(status="error", steps_run=0, error=str(failure), notes=notes)
    except KeyboardInterrupt as exc:
        log(f"Interrupted ({interrupt_name(exc)}) during the replay.", "yellow")
        result = interrupted_result(data, exc, notes)
        finding = None
    except Exception as exc:  # noqa: BLE001 - every failure of a replay is an exit 2 with its report
        message = str(exc) if isinstance(exc, InputError) else \
            f"Replaying bundle {bundle} failed: {describe_exception(exc)}."
        log.record_error(message)
        log.close()
        raise InputError(message) from None
    if finding is not None:
        recorded = data["finding"]
        written = re.search(r"wrote buffer `([^`]+)` at step (\d+)", recorded.get("explanation") or "")
        if written and finding.explanation.startswith(f"buffer `{written[1]}`"):  # a writer of an earlier step
            result.notes.append(f"The recorded origin, {recorded['op']} at step {written[2]}, wrote buffer "
                                f"`{written[1]}`; the bundle holds the later step where that buffer reached the "
                                f"harm, so its replay meets the buffer already non-finite, as recorded.")
        else:
            result.notes.append("Same origin as recorded in the bundle." if same_origin(recorded, finding) else
                                f"The recorded origin was {recorded['module']} {recorded['op']} "
                                f"({recorded['cause']}); the replay differs (non-determinism or another device).")
    elif not result.interrupted and result.status != "error":
        result.notes.append("The replay did not reproduce a non-finite value.")
    if trainer is not None:
        result.recipe = trainer.recipe.describe()
    presented = present(log, result, trainer.model if trainer is not None else None, OutputOptions(report),
                        settings={**data["settings"], "device": device_spec}, device=device,
                        elapsed=time.perf_counter() - started, extra={"replay_of": bundle},
                        interrupted_by=interrupt_name())
    if not presented.ok:
        raise OutputWriteError(presented.why)
    return exit_code(result)
