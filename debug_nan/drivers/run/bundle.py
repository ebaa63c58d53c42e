"""The repro bundle of a `debug-nan run` finding: the script's own objects, so `debug-nan replay` needs no script.

What every bundle holds (engine/session/repro.py: the micro-batches as the model took them, their RNG states, the
trip) plus, under "script", what the Trainer would rebuild from a task and `run` cannot: the model, optimizer and
LR scheduler themselves, at the failing step's start, and the tapes of the script's code around the model
(drivers/run/tape.py). They are pickled with cloudpickle inside torch's file format (tensors as torch stores them,
read back onto any device): classes and functions of the script's `__main__` and of every module it imported from
outside site-packages and the standard library (its own model.py) by value, so the bundle replays without the
script's files, on another machine too; libraries (torch, transformers) by reference, to be installed where it
replays. The GradScaler is kept as its state (a GradScaler mid-step does not pickle).
"""

from __future__ import annotations

import os
import sys
import sysconfig
import types
from contextlib import contextmanager

import torch

from debug_nan import torch_support
from debug_nan.drivers.run.recorder import operator_name
from debug_nan.drivers.run.replayer import ScriptReplayDriver
from debug_nan.drivers.run.tape import Tape
from debug_nan.engine.replay.driver import NotReplayable, StepInputs
from debug_nan.engine.replay.pinpoint import Pinpointer
from debug_nan.engine.replay.snapshot import Snapshot
from debug_nan.engine.replay.trip import Trip
from debug_nan.engine.vocabulary import adapt_advice
from debug_nan.engine.watch.watch_result import Check

PROTOCOL = 4  # (torch.save's default, 2, predates what cloudpickle writes for classes kept by value)


class NoBundle(Exception):
    """A `run` finding's bundle cannot be written; the message says why (the log shows it, the finding stands)."""


def script_state(state: dict, model, optimizer, scheduler, world: int = 1) -> dict:
    """A bundle's content (repro_state) for `run`: the model and optimizer state dicts replaced by the objects
    (restored by repro_state to the failing step's start), the tapes made portable."""
    try:
        tapes = [tape.portable() if isinstance(tape, Tape) else None for tape in state.pop("tapes")]
        update = state.pop("update")
        update = update.portable() if isinstance(update, Tape) else None
    except NotReplayable as why:
        raise NoBundle(f"{why}") from None
    state = {key: value for key, value in state.items() if key not in ("model", "optimizer")}
    return {**state, "script": {"model": model, "optimizer": optimizer, "scheduler": scheduler, "tapes": tapes,
                                "update": update, "world": world}}


def pickle_module() -> types.ModuleType:
    """torch.save's `pickle_module` for a `run` bundle: the standard library's pickle with cloudpickle's Pickler."""
    if torch_support.save_options():  # torch 2.5 on Python 3.13: torch.save works only through its own fallback
        raise NoBundle(f"torch {torch.__version__} on Python 3.13 writes files through the pure-Python pickler "
                       f"only, which cannot pickle the script's own classes (torch 2.6 lifts this)")
    try:
        import cloudpickle
    except ImportError:
        raise NoBundle("cloudpickle is not installed (pip install cloudpickle): it pickles the script's classes") \
            from None
    import pickle

    class Pickler(cloudpickle.Pickler):
        def reducer_override(self, obj):
            if (name := operator_name(obj)) is not None:  # (C++ inside: by name)
                return _operator, name
            return super().reducer_override(obj)

    module = types.ModuleType("debug_nan_cloudpickle")
    module.__dict__.update(pickle.__dict__)
    module.Pickler = Pickler
    return module


def _operator(name: str, overload: str | None):
    """torch.ops' operator of that name (and overload), as a bundle refers to it."""
    namespace, op = name.split("::", 1)
    packet = getattr(getattr(torch.ops, namespace), op)
    return packet if overload is None else getattr(packet, overload)


@contextmanager
def script_modules_by_value():
    """While a bundle is written: the modules the script imported from its own files pickled by value."""
    import cloudpickle

    names = [name for name in _own_modules() if name not in cloudpickle.list_registry_pickle_by_value()]
    for name in names:
        cloudpickle.register_pickle_by_value(sys.modules[name])
    try:
        yield
    finally:
        for name in names:
            if name in sys.modules:
                cloudpickle.unregister_pickle_by_value(sys.modules[name])


def _own_modules() -> list[str]:
    """Top-level modules loaded from a file outside site-packages, the standard library and debug-nan."""
    library = tuple(os.path.realpath(p) + os.sep for p in {sysconfig.get_paths()[k] for k in ("stdlib",
                    "platstdlib", "purelib", "platlib")} | {os.path.dirname(os.path.dirname(torch.__file__))})
    found = []
    for name, module in list(sys.modules.items()):
        where = getattr(module, "__file__", None)
        if "." in name or name == "__main__" or not where or name.startswith("debug_nan"):
            continue
        where = os.path.realpath(where)
        if not where.startswith(library) and "site-packages" not in where \
                and "dist-packages" not in where:
            found.append(name)
    return found


def replay_script_bundle(bundle: dict, device: torch.device, log):
    """`debug-nan replay` of a `run` bundle: its micro-batch (or update) replayed under the op-level tracer from the
    script's objects at the failing step's start, on `device` -> the Finding (None: no NaN/Inf came back).
    Raises TaskFailure where the replay raised with every value finite."""
    script = bundle["script"]
    model, optimizer, scheduler = script["model"], script["optimizer"], script["scheduler"]
    state = optimizer.state_dict() if optimizer is not None else None
    model.to(device)
    if optimizer is not None:
        optimizer.load_state_dict(state)  # (its state follows the parameters onto the device)
    tapes = [tape.to(device) if tape is not None else None for tape in script["tapes"]]
    update = script["update"].to(device) if script["update"] is not None else None
    if bundle["optimizer_phase"] and script.get("world", 1) > 1:
        log(f"  note: rank {bundle['finding'].get('rank')} of {script['world']} wrote this bundle; its update is "
            f"replayed from that rank's own gradients (the run averaged them across the ranks).", "yellow")
    driver = ScriptReplayDriver(model, optimizer, device, log, first_step=bundle.get("first_step") or 0)
    snapshot = Snapshot(model, optimizer, None, scheduler)
    snapshot.save()
    inputs = StepInputs(step=bundle["step"], batches=bundle["batches"], rng=bundle["rng"], snapshot=snapshot,
                        tapes=tapes, update=update, step_groups=bundle.get("step_groups"))
    check = Check(**bundle["check"]) if bundle["check"] else None
    finding = Pinpointer(driver).pinpoint(Trip(inputs, bundle["micro"], check, None, bundle["optimizer_phase"]))
    return adapt_advice(finding, "script") if finding is not None else None
