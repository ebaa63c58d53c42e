"""What the loop hands on: one micro-batch's outcome (for the trip decision) and the observer that turns steps into
log lines (implemented in presentation/step_line.py). The run's result, for the outputs, is result.py's."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from debug_nan.engine.replay.driver import StepInputs
from debug_nan.engine.replay.trip import Trip
from debug_nan.engine.vocabulary import CheckKind
from debug_nan.engine.watch.history import StepRecord
from debug_nan.engine.watch.phase_codes import PHASE_CODE
from debug_nan.engine.watch.watch import Check


@dataclass
class MicroOutcome:
    """One micro-batch, as the trip decision sees it."""

    inputs: StepInputs  # the step so far: its micro-batches, their RNG states, the snapshot before it
    micro: int  # 1-based
    check: Check | None = None  # the earliest non-finite check of the watch
    error: BaseException | None = None  # user code raised
    abort: BaseException | None = None  # DDP: a non-numerical reason to stop (bad input, out of memory, Ctrl-C)
    rank_codes: list[float] | None = None  # DDP: every rank's earliest non-finite phase code (0 = clean)
    record: StepRecord | None = None  # None for the last step's parameter check, after the loop
    previous: StepInputs | None = None  # the step before: a parameter trip is its optimizer update
    grad_norms: list[torch.Tensor] | None = None  # the watch's per-gradient L2 norms, reused for clipping
    new_buffers: list[Check] = field(default_factory=list)  # buffers that turned non-finite (not harm by itself)
    last: bool = False  # the step's last micro-batch
    layer_stats: dict = field(default_factory=dict)  # --trace-every-step: per-module statistics

    @property
    def blames_last_update(self) -> bool:
        """The earliest non-finite value (on any rank, under DDP) is a parameter or optimizer state: the previous
        optimizer step is the one to replay."""
        if self.rank_codes is not None:
            return max(self.rank_codes, default=0) == PHASE_CODE[CheckKind.PARAM]
        return self.check is not None and self.check.kind == CheckKind.PARAM

    @property
    def trip(self) -> Trip | None:
        """What this outcome points the replay at (the one rule): a parameter check blames the previous step's
        optimizer update, replayed through all its micro-batches (None when there is no previous step in this
        run); anything else, this micro-batch."""
        if self.check is not None and self.check.kind == CheckKind.PARAM:
            if self.previous is None:
                return None
            return Trip(self.previous, len(self.previous.batches), self.check, None, optimizer=True)
        return Trip(self.inputs, self.micro, self.check, self.error)

    @property
    def harmed(self) -> bool:
        """This rank's own micro-batch tripped: a check read a non-finite value, or user code raised."""
        return self.check is not None or self.error is not None

    @property
    def only_gradients(self) -> bool:
        """Only the gradients went non-finite (the case an fp16 loss scale can cause)."""
        return self.error is None and self.check is not None and self.check.kind == CheckKind.GRAD


class StepObserver(Protocol):
    """Receives each step's events to show them (the log lines are formatted in presentation/step_line.py)."""

    def begin_step(self, step: int) -> None: ...

    def batch_notes(self, micro: int, lines: list[str]) -> None: ...

    def layer_trace(self, micro: int, layer_stats: dict) -> None: ...

    def end_step(self, record: StepRecord) -> None: ...


class SilentSteps:
    """A StepObserver that shows nothing (benchmarks, bundle replays)."""

    def begin_step(self, step: int) -> None:
        pass

    def batch_notes(self, micro: int, lines: list[str]) -> None:
        pass

    def layer_trace(self, micro: int, layer_stats: dict) -> None:
        pass

    def end_step(self, record: StepRecord) -> None:
        pass
