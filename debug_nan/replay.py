"""`debug-nan replay BUNDLE`: the same finding again, from a repro bundle alone (and its --task file's text).

Rebuilds the task (the built-in model from the bundle's settings, or the --task from its reference) around the
bundle's micro-batches, loads the state from just before the failing step, and replays the failing micro-batch
(or optimizer step) under the op-level tracer.
"""

from __future__ import annotations

import time

import debug_nan
from debug_nan.checks.driver import StepInputs, TaskFailure
from debug_nan.checks.finding import Finding
from debug_nan.checks.watch import Check
from debug_nan.errors import InputError
from debug_nan.report.bundle import read_bundle, same_origin, task_spec_for_replay
from debug_nan.report.log import Log
from debug_nan.report.summary import EXIT_CODES, check_writable, report_dict, write_report, write_summary
from debug_nan.settings import RunSettings
from debug_nan.train.aam_task import build_aam_model_task
from debug_nan.train.device import resolve_device
from debug_nan.train.loop import Trainer
from debug_nan.train.outcome import RunResult
from debug_nan.train.task import load_task


def replay_bundle(path: str, device_spec: str, log) -> tuple[Finding | None, dict, Trainer]:
    """Rebuild the task and state from a bundle and replay its micro-batch -> (finding, bundle, trainer)."""
    b = read_bundle(path)
    settings = RunSettings(**{**b["settings"], "device": device_spec, "report": None, "log": None})
    device = resolve_device(settings.device, log)
    if b["task"]:
        task = load_task(task_spec_for_replay(b), settings)
        task.batches = b["batches"]
    else:
        task = build_aam_model_task(settings, b["batches"])
    trainer = Trainer(task, settings, log, device)
    snapshot = trainer.snapshots[0]
    snapshot.load_state_dicts(b)
    inputs = StepInputs(step=b["step"], batches=b["batches"], rng=b["rng"], snapshot=snapshot)
    check = Check(**b["check"]) if b["check"] else None
    log(f"Replaying step {b['step']}, micro-batch {b['micro']} of a bundle written on {b['device']} "
        f"(torch {b['torch']}) on {device}.")
    try:
        finding = trainer.pinpointer.pinpoint(inputs, b["micro"], check, None, optimizer=b["optimizer_phase"])
    except TaskFailure as failure:
        log(f"The replay raised: {failure}")
        finding = None
    return finding, b, trainer


def run_replay(bundle: str, device_spec: str, report: str | None, log_path: str | None) -> int:
    """Replay, summary, JSON report -> the exit code. Bad input raises InputError (the cli exits 2)."""
    started = time.perf_counter()
    check_writable(report, "--report")
    log = Log(log_path)
    try:
        log.rule(f"debug-nan {debug_nan.__version__} replay {bundle}")
        finding, data, trainer = replay_bundle(bundle, device_spec, log)
    except InputError as exc:
        log.record_error(str(exc))
        log.close()
        raise
    result = RunResult(status="nonfinite" if finding else "clean", steps_run=0, finding=finding,
                       findings=[finding] if finding else [])
    if finding is not None:
        recorded = data["finding"]
        result.notes.append("Same origin as recorded in the bundle." if same_origin(recorded, finding) else
                            f"The recorded origin was {recorded['module']} {recorded['op']} ({recorded['cause']}); "
                            f"the replay differs (non-determinism or another device).")
    else:
        result.notes.append("The replay did not reproduce a non-finite value.")
    result.recipe = trainer.recipe.describe()
    write_summary(log, result, time.perf_counter() - started)
    if report:
        settings = RunSettings(**{**data["settings"], "device": device_spec})
        write_report(report, {**report_dict(result, settings, trainer.device, time.perf_counter() - started),
                              "replay_of": bundle})
        log(f"JSON report written to {report}")
    log.close()
    return EXIT_CODES[result.status]
