"""--checkpoint PATH: start the debug run where the user's run was, from the user's own checkpoint file.

Accepted layouts (torch.load of the file):
  * a bare model state_dict (every value a tensor);
  * a dict with the model under `model` / `model_state_dict` / `state_dict` (a state_dict, or with
    --checkpoint-unsafe-load a pickled nn.Module), and where present `optimizer` / `optimizer_state_dict`
    (Lightning: `optimizer_states`[0]), `scheduler` / `lr_scheduler` / `scheduler_state_dict` (Lightning:
    `lr_schedulers`[0]), `scaler` / `grad_scaler` / `scaler_state_dict`, and the step counter `step` /
    `global_step` (an `epoch` alone is reported, not turned into a step: its length in steps is unknown);
  * anything else through the task's own `load_checkpoint(path, model, optimizer)`, which may return the step.
Keys saved under a wrapper (`module.` from DDP, `_orig_mod.` from torch.compile, `model.` from Lightning) are
matched when stripping that one prefix makes every key fit. Missing, unexpected or mis-shaped keys are an
InputError (exit 2) naming the first few and the counts; --checkpoint-non-strict loads the keys that fit and
names the rest. The file is read with torch.load(weights_only=True) unless --checkpoint-unsafe-load.
With --fsdp the full tensors are loaded into the sharded model and optimizer (sharding.py); a task's own
load_checkpoint receives the sharded ones.
"""

from __future__ import annotations

import pickle
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import torch

from debug_nan.drivers.trainer.sharding import load_full_model_state, load_full_optimizer_state
from debug_nan.errors import InputError, describe_exception

MODEL_KEYS = ("model", "model_state_dict", "state_dict")
OPTIMIZER_KEYS = ("optimizer", "optimizer_state_dict", "optimizer_states")
SCHEDULER_KEYS = ("scheduler", "lr_scheduler", "scheduler_state_dict", "lr_schedulers")
SCALER_KEYS = ("scaler", "grad_scaler", "scaler_state_dict")
STEP_KEYS = ("step", "global_step")
WRAPPER_PREFIXES = ("module.", "_orig_mod.", "model.")
SHOWN = 5  # names listed per kind of mismatch


@dataclass
class Resumed:
    """What a checkpoint restored: the step counter (optimizer steps already done) and what was loaded."""

    path: str
    step: int = 0
    loaded: list[str] = field(default_factory=list)  # "model", "optimizer", "scheduler", "scaler"
    notes: list[str] = field(default_factory=list)

    def line(self) -> str:
        what = ", ".join(self.loaded) or "nothing"
        return f"checkpoint {self.path}: loaded {what}; the run continues at step {self.step + 1}"


def read_checkpoint(path: str, unsafe: bool = False):
    """torch.load on the CPU; every failure is an InputError naming the file and what to do."""
    p = Path(path)
    if not p.exists():
        raise InputError(f"--checkpoint {path} does not exist.")
    if not p.is_file():
        raise InputError(f"--checkpoint {path} is not a file (a folder? give the checkpoint file inside it).")
    with open(p, "rb") as f:
        head = f.read(2)
    size = p.stat().st_size
    if size == 0:
        raise InputError(f"--checkpoint {path} is empty (0 bytes): the save or the copy did not finish.")
    if head == b"PK" and not zipfile.is_zipfile(p):
        raise InputError(f"--checkpoint {path} is truncated or damaged: it starts as a torch.save zip archive but "
                         f"its {size:,} bytes end before the archive does (was the save or the copy cut off?).")
    # torch.save writes a zip archive (or, before torch 1.6 / with _use_new_zipfile_serialization=False, a
    # pickle, which starts with the PROTO opcode 0x80)
    if not zipfile.is_zipfile(p) and head[:1] != b"\x80":
        raise InputError(f"--checkpoint {path} is not a PyTorch checkpoint: neither a torch.save zip archive nor "
                         f"a pickle (it starts with {head!r}).")
    try:
        return torch.load(p, map_location="cpu", weights_only=not unsafe)
    except pickle.UnpicklingError as exc:
        text = str(exc)
        if unsafe or "Weights only load failed" not in text or "Unsupported operand" in text:
            raise InputError(f"--checkpoint {path} is not a PyTorch checkpoint: torch.load failed with "
                             f"{type(exc).__name__}: {text.strip().splitlines()[0] if text.strip() else ''}.") from None
        why = next((line.strip() for line in text.splitlines() if "Unsupported" in line or "error:" in line),
                   text.strip().splitlines()[0])
        raise InputError(f"--checkpoint {path}: torch.load(weights_only=True) refused it ({why}). It holds "
                         f"Python objects beyond tensors and plain containers (a pickled model or optimizer "
                         f"class, an argparse.Namespace, numpy scalars...). If you trust the file, pass "
                         f"--checkpoint-unsafe-load, which unpickles it as it is and can run code stored in it.") \
            from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile, AttributeError, ImportError) as exc:
        raise InputError(f"--checkpoint {path} is not a PyTorch checkpoint (or is truncated): torch.load failed "
                         f"with {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}.") from None


def _is_state_dict(obj) -> bool:
    return isinstance(obj, dict) and bool(obj) and all(isinstance(v, torch.Tensor) for v in obj.values())


def _first(ckpt: dict, keys: tuple[str, ...]):
    """(key, value) of the first of `keys` present and not None; Lightning's lists give their first entry."""
    for key in keys:
        value = ckpt.get(key)
        if isinstance(value, (list, tuple)) and key in ("optimizer_states", "lr_schedulers"):
            value = value[0] if value else None
        if value is not None:
            return key, value
    return None, None


def split_checkpoint(obj, path: str) -> dict:
    """The parts of a checkpoint: {"model": state_dict, "optimizer": ..., "scheduler": ..., "scaler": ...,
    "step": int | None, "epoch": ...} (absent parts are None)."""
    if isinstance(obj, torch.nn.Module):
        return {"model": obj.state_dict()}
    if not isinstance(obj, dict):
        raise InputError(f"--checkpoint {path} holds a {type(obj).__name__}, not a state_dict or a dict of them. "
                         f"A task can load any other format with load_checkpoint(path, model, optimizer).")
    if _is_state_dict(obj):
        return {"model": obj}
    key, model = _first(obj, MODEL_KEYS)
    if key is None:
        keys = ", ".join(sorted(map(str, obj))[:12])
        raise InputError(f"--checkpoint {path} is a dict without model weights: none of the keys "
                         f"{', '.join(MODEL_KEYS)} (its keys: {keys}). A task can load any other layout with "
                         f"load_checkpoint(path, model, optimizer).")
    if isinstance(model, torch.nn.Module):
        model = model.state_dict()
    if not isinstance(model, dict):
        raise InputError(f"--checkpoint {path}: `{key}` holds a {type(model).__name__}, not a state_dict.")
    step_key, step = _first(obj, STEP_KEYS)
    if step is not None and (isinstance(step, bool) or not isinstance(step, (int, torch.Tensor))):
        raise InputError(f"--checkpoint {path}: `{step_key}` is {step!r}, not a step count.")
    return {"model": model, "optimizer": _first(obj, OPTIMIZER_KEYS)[1], "scheduler": _first(obj, SCHEDULER_KEYS)[1],
            "scaler": _first(obj, SCALER_KEYS)[1], "step": int(step) if step is not None else None,
            "epoch": obj.get("epoch")}


def _strip_wrapper(state: dict, expected: set[str]) -> tuple[dict, str | None]:
    """The state with one wrapper prefix removed when that makes every key fit the model (else unchanged)."""
    if set(state) & expected:
        return state, None
    for prefix in WRAPPER_PREFIXES:
        if state and all(k.startswith(prefix) for k in state):
            stripped = {k[len(prefix):]: v for k, v in state.items()}
            if set(stripped) & expected:
                return stripped, prefix
    return state, None


def _names(items: list[str]) -> str:
    shown = ", ".join(f"`{k}`" for k in items[:SHOWN])
    return f"{shown}{f' and {len(items) - SHOWN} more' if len(items) > SHOWN else ''}"


def load_model_state(model: torch.nn.Module, state: dict, path: str, strict: bool, sharded: bool = False) -> list[str]:
    """Load `state` into `model` after checking names and shapes; returns notes (non-strict: what was left).
    sharded: `model` is sharded with FSDP2 (its state_dict's DTensors have the full shapes), `state` full."""
    own = model.state_dict()
    state, prefix = _strip_wrapper(state, set(own))
    notes = [f"checkpoint keys carried the prefix `{prefix}` (a wrapper's); matched without it"] if prefix else []
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k} {list(state[k].shape)} vs the model's {list(own[k].shape)}" for k in own
              if k in state and isinstance(state[k], torch.Tensor) and state[k].shape != own[k].shape]
    problems = []
    if shapes:  # never loadable, strict or not
        problems.append(f"{len(shapes)} of shape different from the model's: {'; '.join(shapes[:SHOWN])}"
                        f"{f' and {len(shapes) - SHOWN} more' if len(shapes) > SHOWN else ''}")
    if strict and missing:
        problems.append(f"{len(missing)} of the model's {len(own)} keys missing from the checkpoint: "
                        f"{_names(missing)}")
    if strict and unexpected:
        problems.append(f"{len(unexpected)} checkpoint keys the model does not have: {_names(unexpected)}")
    if problems:
        hint = (" Build the model with the settings it was trained with (--d-model, --heads, --token-limit, the "
                "task's own), or pass --checkpoint-non-strict to load only the keys that fit." if not shapes else
                " Build the model with the settings it was trained with (--d-model, --heads, --token-limit, the "
                "task's own).")
        raise InputError(f"--checkpoint {path} does not fit the model: {'; '.join(problems)}.{hint}")
    if sharded:
        load_full_model_state(model, {k: v for k, v in state.items() if k in own})
    else:
        model.load_state_dict(state, strict=False)
    if missing:
        notes.append(f"--checkpoint-non-strict: {len(missing)} model keys kept their initial values: "
                     f"{_names(missing)}")
    if unexpected:
        notes.append(f"--checkpoint-non-strict: {len(unexpected)} checkpoint keys ignored: {_names(unexpected)}")
    return notes


def _load_part(what: str, target, state, path: str, load=None) -> None:
    """target.load_state_dict(state), or load(state); a failure is the checkpoint's InputError."""
    try:
        (load or target.load_state_dict)(state)
    except Exception as exc:  # noqa: BLE001 - any mismatch is the checkpoint's, said in one line
        raise InputError(f"--checkpoint {path}: its {what} state does not fit the run's {what} "
                         f"({type(target).__name__}): {type(exc).__name__}: {str(exc).splitlines()[0]}. Use the "
                         f"{what} the checkpoint was saved with (the task's own), or a checkpoint without it.") \
            from None


def restore(path: str, model: torch.nn.Module, optimizer, scheduler, scaler, *, strict: bool = True,
            unsafe: bool = False, task_loader=None, sharded: bool = False) -> Resumed:
    """Load the checkpoint at `path` into the run's model, optimizer, scheduler and scaler (those present in it).
    `task_loader`: the task's load_checkpoint(path, model, optimizer), which replaces the layouts above.
    sharded: the model is sharded with FSDP2 (--fsdp) and the optimizer holds its sharded parameters."""
    resumed = Resumed(path)
    if task_loader is not None:
        try:
            out = task_loader(path, model, optimizer)
        except InputError:
            raise
        except Exception as exc:  # noqa: BLE001 - the task's own code: any failure is its, in one line
            raise InputError(f"--checkpoint {path}: the task's load_checkpoint(path, model, optimizer) raised "
                             f"{describe_exception(exc)}.") from None
        step = out.get("step", out.get("global_step")) if isinstance(out, dict) else out
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise InputError(f"--checkpoint {path}: the task's load_checkpoint returned {out!r}; it must return "
                             f"None, the step count (int >= 0) or a dict with `step`.")
        resumed.step, resumed.loaded = step or 0, ["the task's load_checkpoint"]
        return resumed
    parts = split_checkpoint(read_checkpoint(path, unsafe), path)
    resumed.notes += load_model_state(model, parts["model"], path, strict, sharded)
    resumed.loaded.append("model")
    for what, target in (("optimizer", optimizer), ("scheduler", scheduler), ("scaler", scaler)):
        state = parts.get(what)
        if state is None:
            continue
        if target is None:
            resumed.notes.append(f"the checkpoint's {what} state is not used: this run has no {what}")
            continue
        sharded_optimizer = sharded and what == "optimizer"
        _load_part(what, target, state, path, (lambda full: load_full_optimizer_state(model, target, full))
                   if sharded_optimizer else None)
        resumed.loaded.append(what)
    if parts.get("step") is not None:
        if parts["step"] < 0:
            raise InputError(f"--checkpoint {path}: its step counter is {parts['step']}, which is negative.")
        resumed.step = parts["step"]
    elif parts.get("epoch") is not None:
        resumed.notes.append(f"the checkpoint records epoch {parts['epoch']} but no step counter: steps are "
                             f"numbered from 1 (add `step` or `global_step` to the checkpoint to continue them)")
    if "optimizer" not in resumed.loaded and optimizer is not None:
        resumed.notes.append("no optimizer state in the checkpoint: the optimizer starts fresh (e.g. Adam's "
                             "moments at zero), which changes the first steps")
    if scheduler is not None and "scheduler" not in resumed.loaded and resumed.step:
        resumed.notes.append("no scheduler state in the checkpoint: the learning-rate schedule starts from its "
                             "beginning")
    return resumed


def skip_batches(stream, count: int, log):
    """--skip-batches N: draw and drop N micro-batches (no forward, no update), then go on with the stream. Under
    torchrun each rank skips N of its own share."""
    if count:
        for skipped in range(count):
            try:
                next(stream)
            except StopIteration:  # pragma: no cover - micro_batches never ends
                raise InputError(f"--skip-batches {count}: the data ran out after {skipped} batches.") from None
        log(f"  --skip-batches {count}: fast-forwarded past {count} micro-batch(es) without training.")
    return stream


def resume(s, model: torch.nn.Module, optimizer, scheduler, scaler, task, log, sharded: bool = False) -> int:
    """--checkpoint in a run (s: TrainSettings): restore, say what was loaded -> the step the checkpoint reached.
    sharded: --fsdp under torchrun (the model and optimizer sharded by FSDP2)."""
    if not s.checkpoint:
        return 0
    resumed = restore(s.checkpoint, model, optimizer, scheduler, scaler, strict=not s.checkpoint_non_strict,
                      unsafe=s.checkpoint_unsafe_load, task_loader=task.load_checkpoint, sharded=sharded)
    log(f"  {resumed.line()}")
    for note in resumed.notes:
        log(f"  NOTICE: {note}.", "yellow")
    return resumed.step
