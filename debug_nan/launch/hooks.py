"""Torch's own global hooks, attached from outside an unmodified training script (`debug-nan run`).

What they see, and how a run is cut into steps and micro-batches:
  * every optimizer the script creates (Optimizer.__init__, wrapped): when one is created, the modules that own
    ALL its parameters (found once, by a walk of the garbage collector's objects) get a forward pre-hook with
    the call's keyword arguments;
  * a micro-batch opens at the first forward of such a module (with gradients enabled) since the last backward:
    that module is the root, its call's arguments are the micro-batch's model inputs;
  * a micro-batch closes when a backward is called on a loss (torch.autograd.backward, which Tensor.backward
    calls): a micro-batch is a backward call;
  * a step closes when the optimizer steps (torch's global optimizer step post-hook), or when a GradScaler skips
    it (its update() with no step since the last one).
The listener (the watch) gets those events with the step (1-based: optimizer steps taken + 1) and the micro-batch
within it (1-based), and the tapes (launch/tape.py) of the script's own code: a micro-batch's, from its first forward
to its backward, and the update's, from the last backward to the optimizer step. Nothing here reads a tensor's
values: the hot path is one Python check per model call and per backward, and a recorded call per torch call made
outside the model's forward and the optimizer step.
"""

from __future__ import annotations

import ctypes
import gc
import threading
import weakref
from typing import Protocol

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from contextlib import contextmanager

from debug_nan.checks.module_hooks import ModuleHook
from debug_nan.errors import InputError
from debug_nan.frames import user_location
from debug_nan.launch.tape import MODEL, Recorder, Tape, batch_form


class RunStopped(BaseException):
    """Ends the user's script from inside a hook: a BaseException, so `try/except Exception` in the script does
    not swallow it. `reason`: "trip", "max-steps", "error"."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


class StoppedInThread(RunStopped):
    """The stop of a hook in another thread, raised in the main thread: that thread's stop ends only that thread,
    while the main thread (joining it, or running on) is the script. Raised asynchronously, as a class (what
    PyThreadState_SetAsyncExc takes): `reason` is the stop's (set before it is raised)."""

    last_reason = "trip"

    def __init__(self):
        super().__init__(StoppedInThread.last_reason)


def stop_main_thread(stop: RunStopped) -> None:
    """Raise StoppedInThread in the main thread as soon as it runs Python code (when a join() returns)."""
    StoppedInThread.last_reason = stop.reason
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.main_thread().ident),
                                               ctypes.py_object(StoppedInThread))


class Listener(Protocol):
    def attach(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None: ...
    def micro_begin(self, batch, step: int, micro: int) -> None: ...
    def backward_begin(self, loss: torch.Tensor, step: int, micro: int, tape: Tape | None) -> None: ...
    def backward_end(self, step: int, micro: int) -> None: ...
    def step_begin(self, step: int, update: Tape | None) -> None: ...
    def step_end(self, step: int, skipped: bool) -> None: ...
    def training_ends(self) -> None: ...


def bare(module: nn.Module) -> nn.Module:
    """The user's module inside a DDP / DataParallel wrapper and a torch.compile wrapper (the watch names modules
    as the user wrote them; the replay runs the eager module under the tracer)."""
    while True:
        if isinstance(module, (DistributedDataParallel, nn.DataParallel)):
            module = module.module
        elif type(module).__name__ == "OptimizedModule" and isinstance(getattr(module, "_orig_mod", None), nn.Module):
            module = module._orig_mod
        else:
            return module


def batch_of(args: tuple, kwargs: dict):
    """A forward call's arguments as one batch: the single argument, the keyword arguments (HF models), a list
    of the positional ones, or {"args": [...], **kwargs} when both are given."""
    if kwargs and not args:
        return dict(kwargs)
    if not kwargs:
        return args[0] if len(args) == 1 else list(args)
    return {"args": list(args), **kwargs}


def loss_of(tensors) -> torch.Tensor:
    """The loss of a backward call: its tensor, or for several scalar ones (backward([a, b]) back-propagates
    a + b) their sum in float64, non-finite exactly when one of them is (no overflow of finite losses)."""
    if isinstance(tensors, torch.Tensor):
        return tensors
    if len(tensors) > 1 and all(t.numel() == 1 for t in tensors):
        return torch.stack([t.detach().reshape(()).to(torch.float64) for t in tensors]).sum()
    return tensors[0]


def owners(optimizer: torch.optim.Optimizer) -> list[nn.Module]:
    """Every module that owns all the optimizer's parameters (a model, its DDP wrapper, a LightningModule)."""
    wanted = {id(p) for g in optimizer.param_groups for p in g["params"]}
    if not wanted:
        return []
    found = []
    for obj in gc.get_objects():  # type(), not isinstance(): some lazy objects warn when __class__ is read
        if issubclass(type(obj), nn.Module) and not issubclass(type(obj), torch.jit.ScriptModule):
            ids = {id(p) for p in obj.parameters()}
            if wanted <= ids:
                found.append(obj)
    return found


class Hooks:
    """Install the global hooks (install/uninstall), count steps and micro-batches, tell the listener."""

    def __init__(self, listener: Listener):
        self.listener = listener
        self.optimizer: torch.optim.Optimizer | None = None  # the one that owns the root's parameters
        self.other_optimizers: list = []  # weak references to optimizers created beside it
        self.root: nn.Module | None = None
        self.step, self.micro = 1, 0
        self.open = False  # a micro-batch's forward has begun and its backward not yet ended
        self.stepped_since_update = False
        self.in_backward = False
        self.scaled: weakref.ref | None = None  # the last GradScaler.scale() output
        self.scaler = None
        self.failure: InputError | None = None  # bad input met inside a hook (raised as RunStopped("error"))
        self.recorder = Recorder()  # the tapes of the script's own code (launch/tape.py)
        self.is_paused = False  # a replay runs: its forwards, backwards and steps are not the run's
        self._calls: list = []  # per model call under way: its tape entry (or None)
        self._in_step = False  # inside an optimizer's own math (the recorder is off)
        self._handles: list = []
        # eager under torch.compile: the root's forward opens a micro-batch even inside a compiled call
        self._forward_pre_hook = ModuleHook(self.forward_pre, compiled="eager")
        self._forward_post_hook = ModuleHook(self.forward_post, compiled="eager")
        self._patched: list[tuple[object, str, object]] = []

    # -- install / uninstall -----------------------------------------------------------------------------------
    def _patch(self, owner, name: str, wrapper) -> None:
        self._patched.append((owner, name, getattr(owner, name)))
        setattr(owner, name, wrapper)

    def install(self) -> None:
        hooks = self
        init, backward = torch.optim.Optimizer.__init__, torch.autograd.backward
        scale, update = torch.amp.GradScaler.scale, torch.amp.GradScaler.update

        def optimizer_init(optimizer, *args, **kwargs):
            init(optimizer, *args, **kwargs)
            hooks.created(optimizer)

        def autograd_backward(tensors, *args, **kwargs):
            return hooks.backward(backward, tensors, *args, **kwargs)

        def scaler_scale(scaler, outputs):
            out = scale(scaler, outputs)
            if isinstance(out, torch.Tensor) and scaler.is_enabled():
                hooks.scaled, hooks.scaler = weakref.ref(out), scaler
            return out

        def scaler_update(scaler, *args, **kwargs):
            update(scaler, *args, **kwargs)
            hooks.updated()

        def thread_excepthook(args, original=threading.excepthook):
            if isinstance(args.exc_value, RunStopped):  # a stop in a training thread stops the script, quietly
                stop_main_thread(args.exc_value)
            else:
                original(args)

        self._patch(torch.optim.Optimizer, "__init__", optimizer_init)
        self._patch(torch.autograd, "backward", autograd_backward)
        self._patch(torch.amp.GradScaler, "scale", scaler_scale)
        self._patch(torch.amp.GradScaler, "update", scaler_update)
        self._patch(threading, "excepthook", thread_excepthook)
        if torch.distributed.is_available():
            destroy = torch.distributed.destroy_process_group

            def destroy_process_group(*args, **kwargs):
                if not hooks.is_paused and hooks.root is not None:
                    hooks.listener.training_ends()  # the last update's check, while the ranks can still agree
                return destroy(*args, **kwargs)

            self._patch(torch.distributed, "destroy_process_group", destroy_process_group)
        self._handles += [register_optimizer_step_pre_hook(self.step_pre),
                          register_optimizer_step_post_hook(self.step_post)]
        self.recorder.install()

    def uninstall(self) -> None:
        self.recorder.uninstall()
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for owner, name, original in reversed(self._patched):
            setattr(owner, name, original)
        self._patched.clear()

    # -- optimizers and the root -------------------------------------------------------------------------------
    def created(self, optimizer: torch.optim.Optimizer) -> None:
        if self.root is not None:
            self.other_optimizers.append(weakref.ref(optimizer))
            return
        for module in owners(optimizer):
            self._handles += [module.register_forward_pre_hook(self._forward_pre_hook, with_kwargs=True),
                              module.register_forward_hook(self._forward_post_hook, with_kwargs=True,
                                                           always_call=True)]
        self.other_optimizers.append(weakref.ref(optimizer))

    @contextmanager
    def paused(self):
        """A replay in this process: no event is the run's, and nothing is recorded."""
        was, tape = self.is_paused, self.recorder.tape
        self.is_paused, self.recorder.tape = True, None
        try:
            yield
        finally:
            self.is_paused, self.recorder.tape = was, tape

    def forward_pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """A call of a module that owns the optimizer's parameters: the model's forward is no script code (the
        recorder is off inside it); its first with gradients since the last backward opens a micro-batch."""
        if self.is_paused:
            return
        nested = bool(self._calls)
        self.recorder.suspend()
        self._calls.append(None)
        if nested:  # an owner inside an owner (a DDP wrapper's module): one model call
            return
        self._open_micro(module, args, kwargs)
        tape = self.recorder.tape
        if tape is not None and self.open and (module is self.root or bare(module) is bare(self.root)):
            if not tape.entries:  # the micro-batch's first call: its arguments are the captured batch
                tape.first_inputs(args, kwargs)
                self._calls[-1] = tape.model_call((), {})
            else:
                self._calls[-1] = tape.model_call(args, kwargs)

    def forward_post(self, module: nn.Module, args: tuple, kwargs: dict, output) -> None:
        if self.is_paused or not self._calls:
            return
        entry = self._calls.pop()
        tape = self.recorder.tape
        if entry is not None and tape is not None:
            tape.returned(entry, output)
        self.recorder.resume()

    def _open_micro(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if self.open or self.in_backward or not torch.is_grad_enabled():
            return
        if self.root is None:
            model = bare(module)
            ids = {id(p) for p in model.parameters()}
            live = [r() for r in self.other_optimizers]
            mine = [o for o in live if o is not None
                    and {id(p) for g in o.param_groups for p in g["params"]} <= ids]
            if not mine:  # its optimizer is gone already: not the training model
                return
            self.root, self.optimizer = module, mine[-1]
            self.other_optimizers = [weakref.ref(o) for o in live if o is not None and o is not self.optimizer]
            self.listener.attach(model, self.optimizer)
        elif module is not self.root:
            return
        self.open = True
        self.micro += 1
        self.recorder.tape = Tape(first_form=batch_form(args, kwargs))
        self.listener.micro_begin(batch_of(args, kwargs), self.step, self.micro)

    # -- backward ----------------------------------------------------------------------------------------------
    def backward(self, original, tensors, *args, **kwargs):
        if not self.open or self.in_backward or self.is_paused:
            return original(tensors, *args, **kwargs)
        tape, self.recorder.tape = self.recorder.tape, None
        if tape is not None:
            tape.close((tensors, *args), kwargs)
        loss = loss_of(tensors)
        scaled = self.scaled() if self.scaled is not None else None
        if scaled is not None and scaled is loss:
            loss = loss / self.scaler._scale  # the loss as computed (on the device: no sync)
        self.in_backward = True
        try:
            self.listener.backward_begin(loss.detach(), self.step, self.micro, tape)
            # the script's own anomaly mode would raise on a NaN gradient before the watch reads it: the watch
            # reports it (the trip stops the script at this backward all the same)
            with torch.autograd.set_detect_anomaly(torch.is_anomaly_enabled(), check_nan=False):
                result = original(tensors, *args, **kwargs)
        finally:
            self.in_backward = False
        self.open = False
        self.recorder.tape = Tape(previous=tape)  # the update: what the script does before the optimizer step
        self.listener.backward_end(self.step, self.micro)
        return result

    # -- steps -------------------------------------------------------------------------------------------------
    def _mine(self, optimizer) -> bool:
        if self.optimizer is None or optimizer is self.optimizer:
            return self.optimizer is not None
        if any(r() is optimizer for r in self.other_optimizers):
            self.failure = InputError(f"the script steps two optimizers ({type(self.optimizer).__name__} and "
                             f"{type(optimizer).__name__}, e.g. a GAN's generator and discriminator): debug-nan run "
                             f"watches one optimizer and the model that owns its parameters. Use the Python API "
                             f"(debug_nan.Monitor) around one of them instead.")
            raise RunStopped("error")
        return False

    def step_pre(self, optimizer, args, kwargs):
        """Before an optimizer step: the update's tape ends here, and the optimizer's own ops are not the script's
        code (the recorder is off). A closure (Lightning's way) runs the micro-batch inside the step: it is wrapped
        so that the update's tape ends when it returns, before the optimizer's own math."""
        if self.is_paused:
            return None
        closure = args[1] if len(args) > 1 else kwargs.get("closure")  # (args[0] is the optimizer itself)
        if closure is None:
            self._end_update(optimizer)
            return None
        hooks = self

        def after_closure(*a, **k):
            result = closure(*a, **k)
            if not hooks.is_paused:
                hooks._end_update(optimizer, closure_calls=True)
            return result

        if len(args) > 1:
            return (args[0], after_closure, *args[2:]), kwargs
        return args, {**kwargs, "closure": after_closure}

    def _end_update(self, optimizer, closure_calls: bool = False) -> None:
        if self._in_step:  # (LBFGS calls its closure again: the step's tape was handed on already)
            return
        if self.optimizer is not None and self._mine(optimizer):
            update, self.recorder.tape = self.recorder.tape, None
            if update is not None:
                update.step_location = user_location(2)  # the script's `optimizer.step()` line
            if update is not None and closure_calls and type(optimizer).__name__ == "LBFGS":
                update.unreplayable = "LBFGS calls its closure many times in one step, which no replay can follow"
            self.listener.step_begin(self.step, update)
        self.recorder.suspend()  # (the optimizer's own ops are not the script's code)
        self._in_step = True

    def step_post(self, optimizer, args, kwargs) -> None:
        if self.is_paused:
            return
        if self._in_step:
            self.recorder.resume()
            self._in_step = False
        if self._mine(optimizer):
            self.stepped_since_update = True
            self._close_step(skipped=False)

    def updated(self) -> None:
        """GradScaler.update(): a step it skipped (inf gradients) had no optimizer step; it closes here."""
        if not self.stepped_since_update and self.micro:
            self._close_step(skipped=True)
        self.stepped_since_update = False

    def _close_step(self, skipped: bool) -> None:
        step = self.step
        self.step, self.micro = step + 1, 0
        self.listener.step_end(step, skipped)
