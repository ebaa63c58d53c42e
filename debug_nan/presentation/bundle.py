"""Repro bundles, the file format: one file that replays a finding, on this machine or another (CPU or GPU).

It holds what the Trainer's repro_state() gives (the model, optimizer, scaler and scheduler state and each
module's training flag from just before the failing step, the step's micro-batches up to the failing one as
produced, on the CPU, the RNG state before each, the settings) plus the task reference: a --task file's absolute
path and text, so a replay works from another folder or machine and runs the task as it was at the run (not as
the file is now). app/replay.py rebuilds the run from it. The file is signed (presentation/bundle_signature.py) and
checked before it is unpickled; one that holds nothing but tensors and plain values (the built-in task's, a
--task's) is read with torch.load(weights_only=True).
"""

from __future__ import annotations

import io
import warnings
from collections import OrderedDict
from pathlib import Path

import torch

import debug_nan
from debug_nan import torch_support
from debug_nan.engine.explain.finding import Finding
from debug_nan.errors import InputError
from debug_nan.presentation import bundle_key, bundle_signature
from debug_nan.presentation.outputs import OutputWriteError, atomic_write

BUNDLE_VERSION = 2  # 2: signed (version 1 bundles, unsigned, replay with --trust)
READS = (1, 2)  # the versions of the content this debug-nan replays


# what app/replay.py reads from a bundle: a file without one of these is not a bundle it can replay
REQUIRED_KEYS = ("settings", "step", "micro", "optimizer_phase", "check", "batches", "rng", "finding", "task")


def write_bundle(directory: str | Path, state: dict, pickler: dict | None = None) -> Path:
    """Write `state` (engine/session/repro.py's repro_state()) atomically as debug-nan-bundle-step{S}-micro{M}.pt in
    `directory` (OutputWriteError, naming the folder and the reason, when it cannot: a full disk, a read-only
    folder). `pickler`: torch.save's pickle_module and pickle_protocol, where the state holds objects the standard
    pickler cannot write (`debug-nan run`'s: drivers/run/bundle.py)."""
    directory = Path(directory)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OutputWriteError(f"--bundle-dir {directory}: cannot create the folder ({exc.strerror or exc}).") from None
    path = directory / f"debug-nan-bundle-step{state['step']}-micro{state['micro']}.pt"
    data = {"version": BUNDLE_VERSION, **state, **task_reference(state["settings"].get("task"))}
    try:
        key = bundle_key.own_key(create=True)
    except bundle_key.BundleKeyError as exc:
        raise OutputWriteError(f"repro bundle {path}: not written: {exc}.") from None
    # a batch value that cannot be pickled fails inside the write too, leaving no half file
    options = pickler or torch_support.save_options()
    code = pickler is not None or not weights_only_safe(data)

    def write(handle) -> None:
        buffer = io.BytesIO()
        torch.save(data, buffer, **options)
        payload = buffer.getbuffer()
        handle.write(bundle_signature.header(payload, code, BUNDLE_VERSION, key))
        handle.write(payload)

    atomic_write(path, write, "repro bundle")
    return path


_PLAIN = (str, int, float, bool, type(None))


def weights_only_safe(value) -> bool:
    """Does torch.load(weights_only=True) read `value` back, with every supported torch? Tensors, plain scalars and
    strings, in dicts, lists and tuples of exactly those types (a subclass, a NumPy value, an object of the script
    is not; nor torch.dtype, torch.device, torch.Size: not every torch 2.4 reads them so, and no state holds them)."""
    kind = type(value)
    if kind in (torch.Tensor, torch.nn.Parameter) or kind in _PLAIN:
        return True
    if kind in (dict, OrderedDict):
        return all(weights_only_safe(k) and weights_only_safe(v) for k, v in value.items())
    if kind in (list, tuple):
        return all(weights_only_safe(v) for v in value)
    return False


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


def task_file_state(bundle: dict) -> str | None:
    """How the --task file on disk compares with the copy in the bundle, in words (None: no file task)."""
    spec, source = bundle.get("task"), bundle.get("task_source")
    if not spec or source is None:
        return None
    where = Path(spec.rsplit(":", 1)[0])
    if not where.is_file():
        return f"the task file {where} is not on this machine; the replay uses the copy stored in the bundle."
    try:
        same = where.read_text() == source
    except (OSError, UnicodeDecodeError):
        same = False
    if same:
        return f"the task file {where} on disk is the one the bundle stored; the replay uses the stored copy."
    return (f"the task file {where} on disk DIFFERS from the copy stored in the bundle (it changed since the run, "
            f"e.g. a fix): the replay uses the bundle's copy, so it replays the run as it was. To test the file on "
            f"disk, run debug-nan --task {where}:NAME again.")


def read_bundle(path: str | Path, trust: bool = False) -> dict:
    """A bundle's content, once its signature holds (or `trust`), its version checked before it is unpickled."""
    path = Path(path)
    if not path.is_file():
        what = "is a directory, not a bundle file" if path.is_dir() else "does not exist"
        raise InputError(f"Bundle {path} {what}.")
    try:
        opened = bundle_signature.open_bundle(path, trust)
    except bundle_key.BundleKeyError as exc:
        raise InputError(f"Bundle {path} cannot be checked: {exc}.") from None
    _check_version(path, opened.version)
    try:
        with warnings.catch_warnings():  # (torch's own deprecation of the pytree specs a `run` bundle's tapes hold)
            warnings.simplefilter("ignore", FutureWarning)
            data = torch.load(io.BytesIO(opened.payload), map_location="cpu", weights_only=not opened.code)
    except Exception as exc:  # noqa: BLE001 - whatever torch.load raises, the file is not a readable bundle
        raise InputError(f"Bundle {path} is not a debug-nan repro bundle that can be read: "
                         f"{_load_failure(path, opened.payload, exc, opened.code)}.") from None
    version = data.get("version") if isinstance(data, dict) else None
    _check_version(path, version)
    if version not in READS:
        raise InputError(f"Bundle {path} is not a debug-nan repro bundle of version {BUNDLE_VERSION}.")
    missing = [key for key in REQUIRED_KEYS if key not in data]
    if missing:
        raise InputError(f"Bundle {path} is a debug-nan bundle without its content ({', '.join(missing)} missing): "
                         f"it was not written by debug-nan's run, or was edited. Write it again with the run.")
    return data


def _check_version(path: Path, version) -> None:
    """A version newer than this debug-nan's is said before anything is unpickled (the header's) and after."""
    if isinstance(version, int) and not isinstance(version, bool) and version > BUNDLE_VERSION:
        raise InputError(f"Bundle {path} was written by a newer debug-nan (bundle version {version}; this debug-nan "
                         f"{debug_nan.__version__} reads version {BUNDLE_VERSION}): replay it with the debug-nan "
                         f"that wrote it, or upgrade.")


def _load_failure(path: Path, payload: bytes, exc: Exception, trusted_code: bool) -> str:
    """Why torch.load failed, in words: a cut-off copy reads as 'OSError: [Errno 22]' or a zip error."""
    text = f"{type(exc).__name__}: {exc}".splitlines()[0]
    size = len(payload)
    if size == 0:
        return "the file is empty"
    if not trusted_code and "weights only" in text.lower():
        return ("its header says it holds only tensors and plain values, but it holds other objects (it was "
                "changed): it is read with torch.load(weights_only=True)")
    head = bytes(payload[:4])
    if head == b"PK\x03\x04":  # torch's zip format: a damaged or cut-off one
        return (f"the file ({size:,} bytes) looks truncated or damaged (was it copied completely?); torch.load "
                f"said {text}")
    return f"it is not in torch's file format ({text})"


def same_origin(recorded: dict, finding: Finding) -> bool:
    """Does a replay's finding name the origin the bundle recorded?"""
    return all(recorded.get(k) == getattr(finding, k) for k in ("step", "micro_step", "phase", "module", "op", "cause"))
