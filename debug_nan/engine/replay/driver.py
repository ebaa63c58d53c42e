"""The seam between running training steps and replaying one.

Whoever runs the steps (every entry point: drivers/session_driver.py's `SessionDriver`) is a `StepDriver`: the
pinpointer restores a `Snapshot`, re-runs micro-batches with their RNG state and replays the failing one only
through the methods declared here, so every driver shares one replay and none exposes its internals. Each takes
the recorded `tape` alike: `debug-nan run` replays it, a driver that calls its own loss code again ignores it.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch
from torch import nn

from debug_nan.engine.replay.snapshot import Snapshot


class TaskFailure(Exception):
    """User code raised mid-step and the replay found no non-finite value behind it."""


class NotReplayable(Exception):
    """The driver cannot replay this micro-batch (or update) exactly; the message says why, in words. The watch's
    finding then stands, without the op."""


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, Python's MemoryError, or the CPU allocator's RuntimeError."""
    return isinstance(exc, (torch.OutOfMemoryError, MemoryError)) or (
        isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc))


@dataclass
class StepInputs:
    """What a replay of one optimizer step needs: its micro-batches as they were before user code touched them
    (see `capture_batch`), the RNG state before each micro-batch, and the snapshot (taken before this step or an
    earlier one: engine/replay/catch_up.py re-runs the steps between)."""

    step: int
    batches: list
    rng: list = field(default_factory=list)
    snapshot: Snapshot | None = None
    hyper: dict | None = None  # the param groups' settings and the scheduler's state as the step began
    fingerprint: tuple | None = None  # (names, values): the watch's reading of the state as the step began
    tapes: list = field(default_factory=list)  # per micro-batch, what a driver that cannot call the loss code
    # again recorded of it (`debug-nan run`: drivers/run/tape.py); empty for the others
    update: object | None = None  # ... and of the code between the last backward and the optimizer step
    step_groups: list | None = None  # the param groups' settings as the optimizer step began, where the driver
    # sees that moment (a script may change its lr between the backward and the step)

    def tape(self, index: int):
        """The recorded code of micro-batch `index` (0-based), or None."""
        return self.tapes[index] if index < len(self.tapes) else None


@runtime_checkable
class StepDriver(Protocol):
    """What the pinpointer needs from whoever runs the training steps."""

    model: nn.Module  # the bare module the checks hook (no DDP wrapper, no torch.compile wrapper)
    optimizer: torch.optim.Optimizer | None
    device: torch.device
    accumulation_steps: int  # micro-batches per optimizer step (each loss is divided by it)
    first_step: int  # the step the run resumed after (0: a fresh run): a non-finite state met in step
    # first_step + 1 was there before the run (the checkpoint's or the initialisation's)
    checkpoint: str | None  # the checkpoint the run's state was loaded from, where the driver loaded it
    dist: object | None  # under DDP, this rank's DistContext (a rank replaying alone would fall out of step)

    def log(self, line: str = "", colour: str | None = None) -> None:
        """One line of the text log."""

    def replay_loss(self, batch, tape=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The task's loss on the bare module (no DDP collectives: one rank replays alone), as the run computes
        it (autocast included) -> (scalar loss, other logged scalars). `tape`: StepInputs.tape() of this
        micro-batch (None where nothing was recorded), which a driver that calls its own loss code ignores."""

    def backward(self, loss: torch.Tensor, scaled: bool = True) -> None:
        """Backward of loss / accumulation_steps, times the fp16 loss scale when `scaled` (as in the run)."""

    def optimizer_step(self, tape=None) -> None:
        """The optimizer step exactly as the run takes it, from accumulated gradients: unscale (fp16), clip,
        step, schedule. `tape`: StepInputs.update (None where nothing was recorded), as for replay_loss."""

    def average_gradients(self) -> None:
        """Under DDP, average the gradients across the ranks as the run does (every rank takes part);
        a no-op in a single process."""

    def watch_paused(self) -> AbstractContextManager[None]:
        """A context in which the watch records nothing (the replay's own values are not the run's)."""
