"""Repro bundles, the file format: one file that replays a finding, on this machine or another (CPU or GPU).

It holds what the Trainer's repro_state() gives (the model, optimizer, scaler and scheduler state and each
module's training flag from just before the failing step, the step's micro-batches up to the failing one as
produced, on the CPU, the RNG state before each, the settings) plus the task reference: a --task file's absolute
path and text, so a replay works from another folder or machine. replay.py rebuilds the run from it.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import torch

from debug_nan.checks.finding import Finding
from debug_nan.errors import InputError

BUNDLE_VERSION = 1


def write_bundle(directory: str | Path, state: dict) -> Path:
    """Write `state` (Trainer.repro_state()) atomically as debug-nan-bundle-step{S}-micro{M}.pt in `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"debug-nan-bundle-step{state['step']}-micro{state['micro']}.pt"
    data = {"version": BUNDLE_VERSION, **state, **task_reference(state["settings"].get("task"))}
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


def task_spec_for_replay(bundle: dict) -> str:
    """The bundle's task, or, where its file is missing here, the file's text written to a temporary folder."""
    spec = bundle["task"]
    where, name = spec.rsplit(":", 1)
    if bundle.get("task_source") and where.endswith(".py") and not Path(where).is_file():
        folder = Path(tempfile.mkdtemp(prefix="debug-nan-task-"))
        copy = folder / Path(where).name
        copy.write_text(bundle["task_source"])
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


def same_origin(recorded: dict, finding: Finding) -> bool:
    """Does a replay's finding name the origin the bundle recorded?"""
    return all(recorded.get(k) == getattr(finding, k) for k in ("step", "micro_step", "phase", "module", "op", "cause"))
