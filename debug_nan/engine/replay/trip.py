"""Trip: the session's hand-off to the replay. Which step's start to replay from, how far, and what the watch saw.

The one rule for what a trip points at lives in MicroOutcome.trip (engine/session/outcome.py): a parameter or
optimizer-state check blames the previous step's update (replay that step through all its micro-batches and its
optimizer step); any other check, or user code raising, blames the current micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from debug_nan.engine.replay.driver import StepInputs
from debug_nan.engine.watch.watch_result import Check
from debug_nan.errors import describe_exception


@dataclass(frozen=True)
class Trip:
    inputs: StepInputs  # the step to replay (its micro-batches, RNG states, tapes, the snapshot before it)
    micro: int  # 1-based micro-batch to replay; for an update: the step's last one, after which it came
    check: Check | None  # the watch's earliest non-finite check (None: user code raised with all values finite)
    error: BaseException | None = None  # user code raised (never carried for an update: it came a step later)
    optimizer: bool = False  # the step's optimizer update is the suspect

    @property
    def step(self) -> int:
        return self.inputs.step

    @property
    def batch(self):
        """The tripped micro-batch as produced (before user code touched it)."""
        return self.inputs.batches[self.micro - 1]

    def seen(self) -> str:
        """What the watch saw, in words, for the log."""
        if self.check is not None:
            return f"{self.check.kind} check of `{self.check.label}` read {self.check.value}"
        return f"user code raised {describe_exception(self.error)}"

    def to_dict(self) -> dict:
        """The trip as data (a repro bundle's `step`, `micro`, `optimizer_phase`, `check` keys hold the same)."""
        return {"step": self.step, "micro": self.micro, "optimizer_phase": self.optimizer,
                "check": self.check.to_dict() if self.check is not None else None,
                "error": describe_exception(self.error) if self.error is not None else None}
