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
within it (1-based), and the tapes (drivers/run/tape.py) of the script's own code: a micro-batch's, from its first
forward to its backward, and the update's, from the last backward to the optimizer step. Nothing here reads a tensor's
values: the hot path is one Python check per model call and per backward, and a recorded call per torch call made
outside the model's forward and the optimizer step.
"""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from typing import Protocol

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

from debug_nan.drivers.run.hook_state import HookState, Micro, Updates
from debug_nan.drivers.run.model_calls import batch_of, loss_of, redirected_forward
from debug_nan.drivers.run.optimizers import WatchedOptimizer
from debug_nan.drivers.run.recorder import Recorder
from debug_nan.drivers.run.stops import RunStopped, stop_main_thread
from debug_nan.drivers.run.tape import Tape, batch_form
from debug_nan.drivers.wrappers import bare, step_location
from debug_nan.engine.watch.clipping import clip_watching, forget_clipping
from debug_nan.engine.watch.module_hooks import ModuleHook
from debug_nan.engine.watch.sampled import forget_batches, sampling
from debug_nan.errors import InputError
from debug_nan.frames import calls_through

__all__ = ["Hooks", "Listener", "RunStopped"]

OUTSIDE_TRAINING = "outside training"  # a model call's mark: a forward with gradients off, outside a micro-batch


class Listener(Protocol):
    """Every event the hooks send (app/run_watch.py's Watch in a run), in the order a step meets them."""

    def attach(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        """The watched model and optimizer are known (the first training forward)."""

    def follow(self, optimizer: torch.optim.Optimizer) -> None:
        """A newer optimizer of the same model steps instead of the watched one (a second training stage)."""

    def micro_begin(self, batch, step: int, micro: int) -> None:
        """A micro-batch's first forward: its model inputs."""

    def forwards_given_up(self, tape: Tape, calls: list[int], outputs: list) -> None:
        """At a backward: the micro-batch's model calls (tape entries `calls`) whose `outputs` it does not take."""

    def backward_begin(self, loss: torch.Tensor, step: int, micro: int, tape: Tape | None) -> None:
        """The micro-batch's backward begins, on `loss` (before a GradScaler's scale); `tape`: its code."""

    def backward_end(self, step: int, micro: int) -> None:
        """Its backward ended."""

    def step_begin(self, step: int, update: Tape | None) -> None:
        """The optimizer step begins; `update`: the code between the last backward and it."""

    def step_end(self, step: int, skipped: bool) -> None:
        """The step closed: the optimizer stepped, or a GradScaler skipped it (`skipped`)."""

    def training_ends(self) -> None:
        """The script destroys its process group: the last update is checked while the ranks can agree."""

    def eval_begin(self, module: nn.Module, args: tuple, kwargs: dict, steps_taken: int) -> None:
        """A forward of the model with gradients off outside a micro-batch (validation, generation) begins."""

    def eval_end(self, output) -> None:
        """... and ended, with its output."""


class Hooks(WatchedOptimizer):
    """Install the global hooks (install/uninstall), count steps and micro-batches, tell the listener. What they
    know of the run is `state` (HookState); the rest is their own machinery (the recorder, the handles)."""

    def __init__(self, listener: Listener):
        self.listener = listener
        self.state = HookState()  # where the script is, what is watched, what stepped (drivers/run/hook_state.py)
        self.failure: InputError | None = None  # bad input met inside a hook (raised as RunStopped("error"))
        self.recorder = Recorder()  # the tapes of the script's own code (drivers/run/tape.py)
        self.outputs: list = []  # the open micro-batch's model outputs (a script may give up on them)
        self._calls: list = []  # per model call under way: its tape entry (or None)
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
            with calls_through:  # (the script's own error, e.g. an invalid lr, stays the script's)
                init(optimizer, *args, **kwargs)
            hooks.created(optimizer)

        scheduler_init = torch.optim.lr_scheduler.LRScheduler.__init__

        def lr_scheduler_init(scheduler, *args, **kwargs):
            with calls_through:
                scheduler_init(scheduler, *args, **kwargs)
            hooks.state.schedulers.append(weakref.ref(scheduler))

        def autograd_backward(tensors, *args, **kwargs):
            hooks.recorder.suspend()  # (the backward, and the watch's work at it, are no script code)
            try:
                with calls_through:
                    return hooks.backward(backward, tensors, *args, **kwargs)
            finally:
                hooks.recorder.resume()  # (back on the stack with the update's tape)

        def scaler_scale(scaler, outputs):
            with calls_through:
                out = scale(scaler, outputs)
            if isinstance(out, torch.Tensor) and scaler.is_enabled():
                hooks.state.scaled, hooks.state.scaler = weakref.ref(out), scaler
                hooks.state.unscaled = outputs.detach()  # (a scaled loss past float32's range by design: no harm)
                if hooks.recorder.tape is not None:  # (the fp16 probe replays the backward of `outputs` at scale 1)
                    hooks.recorder.tape.loss_scaled(out, outputs)
            return out

        def scaler_update(scaler, *args, **kwargs):
            with calls_through:
                update(scaler, *args, **kwargs)
            hooks.updated()

        def thread_excepthook(args, original=threading.excepthook):
            if isinstance(args.exc_value, RunStopped):  # a stop in a training thread stops the script, quietly
                stop_main_thread(args.exc_value)
            else:
                original(args)

        self._patch(torch.optim.Optimizer, "__init__", optimizer_init)
        self._patch(torch.optim.lr_scheduler.LRScheduler, "__init__", lr_scheduler_init)
        self._patch(torch.autograd, "backward", autograd_backward)
        self._patch(torch.amp.GradScaler, "scale", scaler_scale)
        self._patch(torch.amp.GradScaler, "update", scaler_update)
        self._patch(threading, "excepthook", thread_excepthook)
        forget_clipping()  # (an earlier run in this process clipped, maybe)
        forget_batches()
        loader_iterator = torch.utils.data.dataloader._BaseDataLoaderIter  # (a data finding's dataset indices)
        for name, wrapper in sampling(loader_iterator).items():
            self._patch(loader_iterator, name, wrapper)
        for clip, bound in (("clip_grad_norm_", "max_norm"), ("clip_grad_value_", "clip_value")):
            for owner in (torch.nn.utils, torch.nn.utils.clip_grad):  # (the advice suggests clipping only if unseen)
                self._patch(owner, clip, clip_watching(getattr(owner, clip), bound))
        if torch.distributed.is_available():
            destroy = torch.distributed.destroy_process_group

            def destroy_process_group(*args, **kwargs):
                if not hooks.state.paused and hooks.state.root is not None:
                    hooks.flush_step()
                    hooks.listener.training_ends()  # the last update's check, while the ranks can still agree
                with calls_through:
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

    @contextmanager
    def paused(self):
        """A replay in this process: no event is the run's, and nothing is recorded."""
        was, tape = self.state.paused, self.recorder.tape
        self.state.paused, self.recorder.tape = True, None
        try:
            yield
        finally:
            self.state.paused, self.recorder.tape = was, tape

    def forward_pre(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        """A call of a module that owns the optimizer's parameters: the model's forward is no script code (the
        recorder is off inside it); its first with gradients since the last backward opens a micro-batch."""
        if self.state.paused:
            return
        nested = bool(self._calls)
        self.recorder.suspend()
        self._calls.append(None)
        if nested:  # an owner inside an owner (a DDP wrapper's module): one model call
            return
        if self.state.phase is Micro.CLOSED and not torch.is_grad_enabled():  # validation, generation
            if self._adopt(module):
                self.flush_step()
                self._end_manual_update()  # (else its tape would record the whole validation pass, outputs and all)
                self._calls[-1] = OUTSIDE_TRAINING
                self.listener.eval_begin(module, args, kwargs, self.state.step - 1)
            return
        self._open_micro(module, args, kwargs)
        tape = self.recorder.tape
        if tape is not None and self.state.open and self._is_model(module):
            if not tape.entries:  # the micro-batch's first call: its arguments are the captured batch
                tape.first_inputs(args, kwargs)
                self._calls[-1] = tape.model_call((), {})
            else:
                self._calls[-1] = tape.model_call(args, kwargs)
            if self.state.models is not None:  # (several optimizers: which of the models the replay calls)
                self._calls[-1].member = self.model_path(module)
            self._calls[-1].forward = redirected_forward(bare(module))  # (Lightning's strategies)

    def forward_post(self, module: nn.Module, args: tuple, kwargs: dict, output) -> None:
        if self.state.paused or not self._calls:
            return
        entry = self._calls.pop()
        tape = self.recorder.tape
        if entry is OUTSIDE_TRAINING:
            try:  # (its replay runs with the recorder still off, as the forward did)
                self.listener.eval_end(output)
            finally:
                self.recorder.resume()
            return
        if entry is not None and tape is not None:
            tape.returned(entry, output)
            self.outputs.append(output)  # (alive anyway until the backward, which lets them go)
        self.recorder.resume()

    def _open_micro(self, module: nn.Module | None, args: tuple, kwargs: dict) -> None:
        """A micro-batch opens at `module`'s forward; with module None, at a backward whose forwards ran before the
        last backward (several models: an actor-critic's second loss), with no batch of its own."""
        if self.state.phase is not Micro.CLOSED or not torch.is_grad_enabled():
            return
        if module is not None and not (self._adopt(module) if self.state.root is None else
                                       self._is_model(module) if self.several else module is self.state.root):
            return
        self.flush_step()
        self._end_manual_update()
        self.state.backward_since_open = self.state.stepped_this_step = False
        self.state.phase = Micro.FORWARD
        self.state.micro += 1
        self.recorder.tape = Tape(first_form=batch_form(args, kwargs), owner=bare(self.state.root))
        self.listener.micro_begin(batch_of(args, kwargs), self.state.step, self.state.micro)

    # -- backward ----------------------------------------------------------------------------------------------
    def backward(self, original, tensors, *args, **kwargs):
        state = self.state
        if state.root is None and state.updates is Updates.UNKNOWN and state.phase is not Micro.BACKWARD \
                and not state.paused and not any(r() is not None for r in state.other_optimizers):
            self._adopt_by_backward(tensors)
        if self.state.phase is Micro.CLOSED and self.several and not self.state.paused:
            self._open_micro(None, (), {})
        if self.state.phase is not Micro.FORWARD or self.state.paused:
            with calls_through:
                return original(tensors, *args, **kwargs)
        tape, self.recorder.tape = self.recorder.tape, None
        outputs, self.outputs = self.outputs, []
        if tape is not None:
            tape.close((tensors, *args), kwargs)
            unused = tape.unused_model_calls() if len(outputs) > 1 else []
            if unused:  # a forward whose outputs no backward takes: one the script gave up on, if non-finite
                self.listener.forwards_given_up(tape, unused, [outputs[n] for n in unused])
        loss = loss_of(tensors)
        scaled = self.state.scaled() if self.state.scaled is not None else None
        if scaled is not None and scaled is loss:
            loss = self.state.unscaled  # the loss as computed, before the scale
        self.state.phase = Micro.BACKWARD
        try:
            self.listener.backward_begin(loss.detach(), self.state.step, self.state.micro, tape)
            # the script's own anomaly mode would raise on a NaN gradient before the watch reads it: the watch
            # reports it (the trip stops the script at this backward all the same)
            with torch.autograd.set_detect_anomaly(torch.is_anomaly_enabled(), check_nan=False), calls_through:
                result = original(tensors, *args, **kwargs)
        finally:
            self.state.phase = Micro.FORWARD  # (a backward that raised leaves its micro-batch open)
        self.state.phase = Micro.CLOSED
        self.state.backward_since_open = True
        # the update: what the script does before the optimizer step
        self.recorder.tape = Tape(previous=tape, owner=tape.owner if tape is not None else None)
        self.listener.backward_end(self.state.step, self.state.micro)
        return result

    # -- steps -------------------------------------------------------------------------------------------------
    def step_pre(self, optimizer, args, kwargs):
        """Before an optimizer step: the update's tape ends here, and the optimizer's own ops are not the script's
        code (the recorder is off). A closure (Lightning's way) runs the micro-batch inside the step: it is wrapped
        so that the update's tape ends when it returns, before the optimizer's own math."""
        if self.state.paused:
            return None
        closure = args[1] if len(args) > 1 else kwargs.get("closure")  # (args[0] is the optimizer itself)
        if closure is None:
            self._end_update(optimizer)
            return None
        hooks = self

        def after_closure(*a, **k):
            with calls_through:
                result = closure(*a, **k)
            if not hooks.state.paused:
                hooks._end_update(optimizer, closure_calls=True)
            return result

        if len(args) > 1:
            return (args[0], after_closure, *args[2:]), kwargs
        return args, {**kwargs, "closure": after_closure}

    def _end_update(self, optimizer, closure_calls: bool = False) -> None:
        if self.state.in_step:  # (LBFGS calls its closure again: the step's tape was handed on already)
            return
        if self.state.optimizer is not None and self._mine(optimizer):
            update, self.recorder.tape = self.recorder.tape, None
            if update is not None:
                update.step_location = step_location(optimizer, 2)  # the script's `optimizer.step()` line
            if update is not None and closure_calls and type(optimizer).__name__ == "LBFGS":
                update.unreplayable = "LBFGS calls its closure many times in one step, which no replay can follow"
            if not self.joins_step(optimizer, update):
                self.state.pending_update = update
                self.listener.step_begin(self.state.step, update)
        self.recorder.suspend()  # (the optimizer's own ops are not the script's code)
        self.state.in_step = True

    def step_post(self, optimizer, args, kwargs) -> None:
        if self.state.paused:
            return
        if self.state.in_step:
            self.recorder.resume()
            self.state.in_step = False
        if self._mine(optimizer):
            self.state.stepped_since_update = self.state.stepped_this_step = True
            if self.several:
                self.state.step_pending = True  # (another optimizer may join this step before the next forward)
            else:
                self._close_step(skipped=False)

    def _end_manual_update(self) -> None:
        """A loop with no optimizer, at a forward after a backward: the script's own update ran between them, and
        its step closes here."""
        if self.state.manual and self.state.backward_since_open:
            if self.state.micro:
                self.close_manual_step()
            else:  # the step whose backward found the model: not watched, but counted
                self.state.step += 1
                self.state.backward_since_open = False

    def close_manual_step(self) -> None:
        """A loop with no optimizer: its update (recorded since the last backward) ends at the next forward, or
        when the command ends."""
        update, self.recorder.tape = self.recorder.tape, None
        self.state.backward_since_open = False
        self.listener.step_begin(self.state.step, update)
        self._close_step(skipped=False)

    def updated(self) -> None:
        """GradScaler.update(): a step it skipped (inf gradients) had no optimizer step; it closes here."""
        if not self.state.stepped_since_update and self.state.micro:
            self._close_step(skipped=True)
        self.state.stepped_since_update = False

    def _close_step(self, skipped: bool) -> None:
        step = self.state.step
        self.state.step, self.state.micro = step + 1, 0
        self.listener.step_end(step, skipped)
