"""Custom autograd Functions in the script's code around the model, recorded whole on the tape.

A TorchFunctionMode does not see `Function.apply`: without this, the tape holds the ops of the Function's
forward (run there with gradients off) and the replay runs them again with gradients on, so autograd's own
derivatives stand in for the Function's backward, and a NaN born in that backward stays finite in the replay. While
the recorder is installed, `Function.apply` of a class outside torch is one tape entry (the class's `apply`,
called again by the replay, which then runs its backward under the tracer); the recorder is off inside it. Torch's
own Functions (DDP's sink, checkpointing) keep their recorded ops, as before.
"""

from __future__ import annotations

import torch

_ORIGINAL = torch.autograd.Function.__dict__["apply"]  # the classmethod object
_recorders: list = []  # the installed recorder (at most one per command)


def _apply(cls, *args, **kwargs):
    recorder = _recorders[-1] if _recorders else None
    tape = recorder.tape if recorder is not None else None
    if tape is None or recorder.suspended or cls.__module__.split(".", 1)[0] == "torch":
        return _ORIGINAL.__func__(cls, *args, **kwargs)
    entry = tape.arguments(cls.apply, args, kwargs)
    recorder.suspend()
    try:
        out = _ORIGINAL.__func__(cls, *args, **kwargs)
    finally:
        recorder.resume()
    tape.returned(entry, out)
    return out


def install(recorder) -> None:
    """Record custom Functions' calls into `recorder`'s open tape: called whenever the recorder goes on torch's
    stack. Off again with it (`uninstall`), inside the model's forward and the optimizer step: torch.compile
    traces a Function's original `apply` there, never this one."""
    if recorder not in _recorders:
        _recorders.append(recorder)
    torch.autograd.Function.apply = classmethod(_apply)


def uninstall(recorder) -> None:
    if recorder in _recorders:
        _recorders.remove(recorder)
    if not _recorders:
        torch.autograd.Function.apply = _ORIGINAL
