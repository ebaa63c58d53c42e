"""Repro bundles: one file that replays a finding, on this machine or another (CPU or GPU).

It holds the model and optimizer (+ scaler, scheduler) state from just before the failing step, the step's
micro-batches up to the failing one as produced (CPU), the RNG state before each, the settings and the task
reference. `debug-nan replay BUNDLE` rebuilds the model (the built-in one from the settings, or the --task from
its reference), loads the state and replays that micro-batch under the op-level tracer.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from debug_nan.checks.pinpoint import StepInputs
from debug_nan.checks.stats import move_to
from debug_nan.checks.watch import Check
from debug_nan.errors import InputError
from debug_nan.report.finding import Finding
from debug_nan.settings import RunSettings

BUNDLE_VERSION = 1


def write_bundle(trainer, inputs: StepInputs, micro: int, finding: Finding, check: Check | None,
                 optimizer_phase: bool, directory: str | Path) -> Path:
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"debug-nan-bundle-step{inputs.step}-micro{micro}.pt"
    states = inputs.snapshot.state_dicts()
    n = trainer.accum if optimizer_phase else micro
    data = {
        "version": BUNDLE_VERSION,
        "finding": finding.to_dict(),
        "step": inputs.step,
        "micro": micro,
        "optimizer_phase": optimizer_phase,
        "check": dataclasses.asdict(check) if check is not None else None,
        "batches": [move_to(b, torch.device("cpu")) for b in inputs.batches[:n]],
        "rng": inputs.rng[:n],
        **states,
        "settings": trainer.s.to_dict(),
        **task_reference(trainer.s.task),
        "torch": torch.__version__,
        "device": str(trainer.device),
    }
    partial = path.with_name(path.name + ".partial")
    try:
        torch.save(data, partial)  # a batch value that cannot be pickled fails here, leaving no half file
        partial.replace(path)
    finally:
        partial.unlink(missing_ok=True)
    return path


def task_reference(spec: str | None) -> dict:
    """A --task as the bundle keeps it: a FILE.py spec with its absolute path and the file's text (so a replay
    works from another folder, or on another machine where the file is not), a module spec as given."""
    if not spec or ":" not in spec:
        return {"task": spec, "task_source": None}
    where, name = spec.rsplit(":", 1)
    path = Path(where)
    if where.endswith(".py") and path.is_file():
        return {"task": f"{path.resolve()}:{name}", "task_source": path.read_text()}
    return {"task": spec, "task_source": None}


def _task_spec_for_replay(b: dict) -> str:
    """The bundle's task, or, where its file is missing here, the file's text written to a temporary folder."""
    import tempfile

    spec = b["task"]
    where, name = spec.rsplit(":", 1)
    if b.get("task_source") and where.endswith(".py") and not Path(where).is_file():
        folder = Path(tempfile.mkdtemp(prefix="debug-nan-task-"))
        copy = folder / Path(where).name
        copy.write_text(b["task_source"])
        return f"{copy}:{name}"
    return spec


def read_bundle(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"Bundle {path} does not exist.")
    try:
        data = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:
        raise InputError(f"Bundle {path} is not a debug-nan repro bundle ({type(exc).__name__}: {exc}).") from None
    if not isinstance(data, dict) or data.get("version") != BUNDLE_VERSION:
        raise InputError(f"Bundle {path} is not a debug-nan repro bundle of version {BUNDLE_VERSION}.")
    return data


def replay_bundle(path: str, device_spec: str, log) -> tuple[Finding | None, dict, object]:
    """Rebuild the task and state from a bundle and replay its micro-batch -> (finding, bundle, trainer)."""
    from debug_nan.checks.pinpoint import TaskFailure
    from debug_nan.train.aam_task import build_aam_model_task
    from debug_nan.train.loop import Trainer, resolve_device
    from debug_nan.train.task import load_task

    b = read_bundle(path)
    settings = RunSettings(**{**b["settings"], "device": device_spec, "report": None, "log": None})
    device = resolve_device(settings.device, log)
    if b["task"]:
        task = load_task(_task_spec_for_replay(b), settings)
        task.batches = b["batches"]
    else:
        task = build_aam_model_task(settings, b["batches"])
    trainer = Trainer(task, settings, log, device)
    trainer.model.load_state_dict(b["model"])
    trainer.optimizer.load_state_dict(b["optimizer"])
    if trainer.scaler is not None and b.get("scaler"):
        trainer.scaler.load_state_dict(b["scaler"])
    if b.get("scheduler"):
        trainer.scheduler.load_state_dict(b["scheduler"])
    snapshot = trainer.snapshots[0]
    snapshot.save()
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


def same_origin(a: dict, b: Finding) -> bool:
    return all(a.get(k) == getattr(b, k) for k in ("step", "micro_step", "phase", "module", "op", "cause"))
