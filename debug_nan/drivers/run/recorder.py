"""The recorder of `debug-nan run`'s tapes (drivers/run/tape.py): a TorchFunctionMode that writes the torch calls
the script makes around its model into the open tape."""

from __future__ import annotations

import threading

import torch
from torch.overrides import TorchFunctionMode

from debug_nan.drivers.run import functions
from debug_nan.drivers.run.tape import Tape
from debug_nan.frames import passed_through, replayed_at

_SCALARS = (bool, int, float, str, torch.Size, torch.dtype, torch.device)  # outputs that change no tensor


def operator_name(func) -> tuple[str, str | None] | None:
    """("aten::gather", "default") for torch.ops.aten.gather.default, (name, None) for its packet, None for any
    other function."""
    if isinstance(func, torch._ops.OpOverload):
        return func._schema.name, func._overloadname
    if isinstance(func, torch._ops.OpOverloadPacket):
        return func._qualified_op_name, None
    return None


def _annotation(func) -> bool:
    """A profiler annotation (an optimizer step's record_function): computes nothing, and its handle is not data."""
    name = operator_name(func)
    return name is not None and name[0].startswith("profiler::")


class Recorder(TorchFunctionMode):
    """Writes the torch calls made while a tape is open into it; passes every call through otherwise.

    It is on torch's function-mode stack while a tape is open, except inside the model's forward, the backward and
    the optimizer step (`suspend` / `resume`), where the ops are many and none is the script's own code. With no
    tape open (from the optimizer step to the next micro-batch's first forward: zero_grad, the data, a validation
    pass) it is off the stack, so those calls pay no Python dispatch (zero_grad's two per parameter: 3.6 us each).
    It goes on below the script's own modes (a mode's __exit__ pops the top of the stack, which must stay the
    script's). The stack is per thread: a script that trains in a thread of its own gets the recorder there at its
    model's first call."""

    def __init__(self):
        super().__init__()
        self._tape: Tape | None = None
        self.installed = False
        self._here = threading.local()  # this thread's: pushed (on its stack), suspended (nested count)

    @property
    def tape(self) -> Tape | None:
        return self._tape

    @tape.setter
    def tape(self, tape: Tape | None) -> None:
        """The open tape; None: nothing to record, and the recorder leaves the stack (when it is on its top)."""
        self._tape = tape
        here = self._here
        if tape is None:
            if getattr(here, "pushed", False) and self._on_top():
                self._pop()
        elif self.installed and not getattr(here, "suspended", 0) and not getattr(here, "pushed", False):
            self._push()

    @property
    def suspended(self) -> int:
        return getattr(self._here, "suspended", 0)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tape = self._tape
        try:  # (an error of the call is the script's, not the recorder's: frames.passed_through)
            if tape is None or self.suspended or getattr(func, "__name__", "") == "backward" or _annotation(func):
                return func(*args, **kwargs)
        except BaseException as exc:
            passed_through(exc)
            raise
        entry = tape.arguments(func, args, kwargs)
        try:
            with replayed_at(entry.location):  # (the script's line, for a tracer running now: `run --trace-at`)
                out = func(*args, **kwargs)
        except BaseException as exc:
            passed_through(exc)
            raise
        if not isinstance(out, _SCALARS):  # (a shape, .item(): nothing a later call can take as a tensor)
            tape.returned(entry, out)
        return out

    def install(self) -> None:
        self.installed = True
        functions.install(self)  # (custom autograd Functions, which this mode does not see: one entry each)
        if self._tape is not None:
            self._push()

    def uninstall(self) -> None:
        self.installed = False
        if getattr(self._here, "pushed", False) and self._on_top():
            torch._C._pop_torch_function_stack()
        self._here.pushed = False
        functions.uninstall(self)

    def _push(self) -> None:
        """On the stack, below the modes there (the script's own, if any: usually none)."""
        above = [torch._C._pop_torch_function_stack() for _ in range(torch._C._len_torch_function_stack())]
        torch._C._push_on_torch_function_stack(self)
        for mode in reversed(above):
            torch._C._push_on_torch_function_stack(mode)
        self._here.pushed = True

    def _pop(self) -> None:
        torch._C._pop_torch_function_stack()
        self._here.pushed = False

    def _on_top(self) -> bool:
        n = torch._C._len_torch_function_stack()
        return n > 0 and torch._C._get_function_stack_at(n - 1) is self

    def suspend(self) -> None:
        """Off the stack and custom Functions' `apply` unwrapped (entering the model's forward or the optimizer
        step); nested calls count. Left as it is where torch holds the recorder aside while it dispatches a call
        (a `backward()`) or a mode of the script's is above it."""
        here = self._here
        here.suspended = getattr(here, "suspended", 0) + 1
        pushed = getattr(here, "pushed", False)
        if here.suspended == 1 and (not pushed or self._on_top()):
            if pushed:
                self._pop()
            functions.uninstall(self)

    def resume(self) -> None:
        """When the last suspend ends: custom Functions' `apply` wrapped again (whether a tape is open or not: the
        script may look `MyFunction.apply` up before the model call that opens one), the recorder back on the
        stack if a tape is open."""
        here = self._here
        here.suspended = max(0, getattr(here, "suspended", 0) - 1)
        if here.suspended == 0 and not getattr(here, "pushed", False) and self.installed:
            functions.install(self)
            if self._tape is not None:
                self._push()
