"""The script's own code replayed from its tapes: the StepDriver methods `debug-nan run`'s driver (drivers/run/
driver.py) shares with the driver of `debug-nan replay` for a bundle `run` wrote (ScriptReplayDriver).

A micro-batch is its tape (drivers/run/tape.py) called again, the model called on the captured batch; an update is
the tape of the code between the last backward and the optimizer step, then the script's own optimizer. Each
recorded call runs again under the autocast state it ran under (the tape's); the backward too, and the fp16 probe's
backward (`scaled=False`) takes the loss a GradScaler scaled, at scale 1. The first replayed output whose dtype is
not the run's is kept in `diverged` (and logged) for the finding to state.
"""

from __future__ import annotations

import io
from contextlib import contextmanager, redirect_stderr, redirect_stdout

import torch

from debug_nan.drivers.run.tape import MODEL, Tape, call_arguments
from debug_nan.engine.replay.driver import NotReplayable
from debug_nan.engine.session.precision import autocast_as
from debug_nan.frames import replayed_at


class TapeReplayer:
    """replay_loss / backward / optimizer_step of the StepDriver protocol, from tapes. Uses self.model (the bare
    module) and self.optimizer (None: a loop that updates its weights itself, all in its update's tape)."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    _backward: tuple | None = None  # the replayed micro-batch's backward() arguments
    _values: list | None = None  # ... and its tape's values (an update may use them)
    _tape: Tape | None = None  # ... and its tape
    diverged: str | None = None  # the first replayed output whose dtype was not the run's, in words

    def replay_loss(self, batch, tape: Tape | None = None):
        """The micro-batch's recorded calls again, the model called on `batch` -> (the first tensor the script's
        backward() took, the others as parts)."""
        if tape is None:
            raise NotReplayable("no record of the script's code for this micro-batch")
        args, kwargs = call_arguments(batch, tape.first_form)
        self._tape = tape
        values = self._values = tape.replay(self.model, args, kwargs)
        self._note_divergence(tape)
        if tape.backward is None:  # the run's micro-batch ended before its backward (it raised, or was given up):
            # the harm to look for is in the model's outputs, as far as the run got
            self._backward = None
            outputs = [values[s] for e in tape.entries if e.func is MODEL for s in e.outputs if s is not None]
            outputs = [t for t in outputs if isinstance(t, torch.Tensor) and t.is_floating_point()]
            if not outputs:
                raise RaisedHere()
            return outputs[0], {f"model output {i}": t for i, t in enumerate(outputs[1:], 2)}
        self._backward = tape.backward_args(values)
        tensors = self._backward[0][0]
        tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
        return tensors[0], {f"backward() tensor {i}": t for i, t in enumerate(tensors[1:], 2)}

    def backward(self, loss, scaled: bool = True) -> None:
        """The script's backward() again, under its autocast state; scaled=False: of the loss before a GradScaler's
        scale (the gradients at scale 1)."""
        if self._backward is None:
            raise RaisedHere()
        args, kwargs = self._backward if scaled else self._tape.backward_args(self._values, scaled=False)
        with autocast_as(self._tape.backward_autocast):
            torch.autograd.backward(*args, **kwargs)

    def _note_divergence(self, tape: Tape) -> None:
        if self.diverged is None and tape.diverged is not None:
            self.diverged = tape.diverged
            self.log(f"  [pinpoint] {tape.diverged}", "yellow")

    def optimizer_step(self, tape: Tape | None = None) -> None:
        """The script's code between its last backward and the optimizer step (clipping, unscaling), then the
        step."""
        if tape is None:
            raise NotReplayable("no record of the script's code before its optimizer step")
        tape.replay(self.model, (), {}, self._values)  # (a loop with no optimizer: its whole update is here)
        self._note_divergence(tape)
        if self.optimizer is not None:
            if tape.stepped is not None:  # several optimizers (ensemble.Optimizers): those the run stepped
                self.optimizer.stepping = tape.stepped
            with replayed_at(tape.step_location):
                self.optimizer.step()


class RaisedHere(RuntimeError):
    """The replay reached the point where the run's micro-batch ended before its backward (it raised, or the
    script gave up on it): the origin before it is the finding."""

    def __init__(self):
        super().__init__("the run's micro-batch ended here, before its backward()")


class ScriptReplayDriver(TapeReplayer):
    """The StepDriver of `debug-nan replay` for a bundle `debug-nan run` wrote: the script's model, optimizer,
    GradScaler and scheduler as the bundle holds them (unpickled, at the failing step's start), replayed from the
    bundle's tapes. Nothing is watched: only the replay runs, in one process."""

    dist = None  # (a torchrun rank's bundle replays alone: its micro-batch, with its own gradients)
    checkpoint = None

    def __init__(self, model, optimizer, device: torch.device, log, first_step: int = 0, accumulation_steps: int = 1):
        self.model, self.optimizer, self.device, self.log = model, optimizer, device, log
        self.first_step, self.accumulation_steps = first_step, accumulation_steps

    def average_gradients(self) -> None:
        """One process: nothing to average."""

    @contextmanager
    def watch_paused(self):
        """What the script's model prints on the way is not the replay's output."""
        sink = io.StringIO()
        with redirect_stdout(sink), redirect_stderr(sink):
            yield
