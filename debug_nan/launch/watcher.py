"""The watch in the user's own run: the step session (train/session.py) driven by the global hooks, replaying in
place.

The run's driver of the session, and the pinpointer's StepDriver: the loss code between the model's forward and the
backward is the script's, so a micro-batch is replayed from its tape (launch/tape.py: the script's torch calls
around the model, recorded as it ran) and an update from the tape of the code between the last backward and the
optimizer step, then the script's own optimizer. The snapshot is the session's, as for every entry point: a trip is
answered at once, from the run's own state at that step, in about one step's time.
A micro-batch's end does not know whether it is its step's last: the step's record is closed (its gradient norms,
the explosion check) when the optimizer steps.
"""

from __future__ import annotations

import time
from contextlib import contextmanager

import torch
import torch.distributed as dist

from debug_nan.checks.driver import NotReplayable
from debug_nan.checks.history import History
from debug_nan.checks.snapshot import schedule_state
from debug_nan.frames import replayed_at
from debug_nan.integrations.session import FrameworkMonitor
from debug_nan.launch.hooks import Hooks, RunStopped
from debug_nan.launch.tape import Tape, call_arguments
from debug_nan.train.outcome import MicroOutcome
from debug_nan.train.session import StepSession


class RunHistory(History):
    """The history, with the last micro-batch's result, whose gradient norms are the step's once the optimizer
    steps."""

    def __init__(self):
        super().__init__()
        self.last = None

    def add_micro(self, rec, result, last: bool) -> None:
        super().add_micro(rec, result, last)
        self.last = result

    def close(self, rec) -> None:
        """The step's optimizer step came: its gradient norms are those of its last micro-batch (accumulated)."""
        self.step_gradients(rec, self.last)
        rec.finish()


class RunSession(StepSession):
    """The session, with the run's history and the fp16 rule of a script whose loss code cannot be run without its
    scale."""

    def __init__(self, driver, policies, watch=None):
        super().__init__(driver, policies, watch)
        self.history = RunHistory()

    def is_scaler_overflow(self, o: MicroOutcome) -> bool:
        """fp16 with a GradScaler, only the gradients non-finite: while the scale is at least 1 this is taken for
        the scaler's overflow (it skips the step and lowers the scale; no probe without the scale here, which
        would need the script's loss code); below 1 it is a finding."""
        if self.scaler is None:
            return False
        return o.record.scaler_skipped or self.scaler.get_scale() >= 1.0

    def skip_overflow(self, o: MicroOutcome) -> None:
        if not o.record.scaler_skipped:
            self.log(f"  [fp16] non-finite gradients at step {o.inputs.step} under a loss scale of "
                     f"{self.scaler.get_scale():g}: taken for the GradScaler's overflow (it skips the step and "
                     f"lowers the scale), not a finding.")
        o.record.scaler_skipped = True


class RunMonitor(FrameworkMonitor):
    framework = "script"
    session_class = RunSession

    def __init__(self, model, optimizer, settings, log, hooks: Hooks, dist_ctx=None):
        super().__init__(model, optimizer, settings, log, dist_ctx=dist_ctx)
        self.hooks = hooks
        self.step_open = False
        self._backward: tuple | None = None  # the replayed micro-batch's backward() arguments
        self._values: list | None = None  # ... and its tape's values (an update may use them)
        self.answer_seconds: float | None = None  # from the sync that tripped to the finding (the pinpoint's cost)

    def finish(self):
        """The last update's check (under DDP, when the script destroys its process group: the ranks agree on it
        and replay its update together while they still can). After the group is gone the parameters are still
        replicas, so every rank decides the same alone."""
        if self.session.p.agreement is not None and not (dist.is_available() and dist.is_initialized()):
            self.session.p.agreement = None
        return super().finish()

    def _settle(self, decide, last: bool):
        started = time.perf_counter()
        finding = super()._settle(decide, last)
        if self.stopped and self.answer_seconds is None:
            self.answer_seconds = time.perf_counter() - started
        return finding

    def adopt_scaler(self, scaler) -> None:
        """The script's GradScaler, known at its first scale(): the gradients' norms are read unscaled."""
        if self.scaler is None and scaler is not None and scaler.is_enabled():
            self.scaler = self.session.scaler = scaler

    # -- StepDriver methods: the script's code, replayed from its tapes ----------------------------------------
    def replay_loss(self, batch, tape: Tape | None = None):
        """The micro-batch's recorded calls again, the model called on `batch` -> (the first tensor the script's
        backward() took, the others as parts)."""
        if tape is None:
            raise NotReplayable("no record of the script's code for this micro-batch")
        args, kwargs = call_arguments(batch, tape.first_form)
        values = self._values = tape.replay(self.model, args, kwargs)
        if tape.backward is None:  # the run raised in this micro-batch: it ends where the run's did
            raise _RaisedHere("the script raised here in the run")
        self._backward = tape.backward_args(values)
        tensors = self._backward[0][0]
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        return tensors[0], {f"backward() tensor {i}": t for i, t in enumerate(tensors[1:], 2)}

    def backward(self, loss, scaled: bool = True) -> None:
        args, kwargs = self._backward
        torch.autograd.backward(*args, **kwargs)

    def optimizer_step(self, tape: Tape | None = None) -> None:
        """The script's code between its last backward and the optimizer step (clipping, unscaling), then the
        step."""
        if tape is None:
            raise NotReplayable("no record of the script's code before its optimizer step")
        tape.replay(self.model, (), {}, self._values)
        with replayed_at(tape.step_location):
            self.optimizer.step()

    @contextmanager
    def watch_paused(self):
        with self.hooks.paused(), self.watch.paused():
            yield

    # -- the hooks' events -------------------------------------------------------------------------------------
    def micro_begin(self, batch, step: int) -> None:
        self.begin(batch, first=not self.step_open, step=step)
        self.step_open = True
        self.session.inputs.tapes.append(None)

    def backward_begin(self, loss: torch.Tensor, tape: Tape | None) -> None:
        self.session.inputs.tapes[-1] = tape
        if self.watch.enabled and loss.numel() == 1:
            self.watch_loss(loss.reshape(()))

    def raised(self, error: BaseException) -> None:
        """The script raised inside a micro-batch (before its backward): its partial tape, then the decision."""
        if self.session.inputs is not None and self.session.inputs.tapes:
            self.session.inputs.tapes[-1] = self.session.inputs.tapes[-1] or self.hooks.recorder.tape
        self.hooks.recorder.tape = None
        self.end(last=False, error=error)

    def backward_end(self) -> None:
        self.end(last=False)
        if self.stopped:
            raise RunStopped("trip")

    def step_begin(self, update: Tape | None) -> None:
        """The optimizer step begins: the update's tape, and the param groups as the step sees them (the script
        may have set its lr since the step began)."""
        inputs = self.session.inputs
        if inputs is not None and not self.stopped:
            inputs.update = update
            inputs.step_groups = schedule_state(self.optimizer, None)["groups"]

    def step_end(self, skipped: bool) -> None:
        """After the optimizer step (or a GradScaler's skip): close the step's record, the explosion check, then
        the parameters are read at the next sync."""
        if self.stopped or not self.step_open:
            return
        self.step_open = False
        record = self.session.record
        record.scaler_skipped = record.scaler_skipped or skipped
        self.history.close(record)
        self.steps_run = self.session.steps
        if not record.scaler_skipped:
            self._settle(lambda: self.session.check_explosion(record), last=False)
        if self.stopped:
            raise RunStopped("trip")
        if not skipped:
            self.stepped()


class _RaisedHere(RuntimeError):
    """The replay reached the point where the run's micro-batch raised (the origin before it is the finding)."""
