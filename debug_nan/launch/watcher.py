"""The watch in the user's own run: the step session (train/session.py) driven by the global hooks.

A trip is not replayed here (the code between the root forward and the backward is the user's, which cannot be
called again in this process): the session's pinpoint records a `Trip`, the script is stopped, and the pinpoint
re-executes the command (launch/reexec.py). So the snapshot is off (the re-execution rebuilds the state from
the start), and every micro-batch's loss is kept, to tell a re-execution that diverged from this run.
A micro-batch's end does not know whether it is its step's last: the step's record is closed (its gradient norms,
the explosion check) when the optimizer steps.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import torch
import torch.distributed as dist

from debug_nan.checks.history import History
from debug_nan.checks.phase_codes import CODE_PHASE, PHASE_CODE
from debug_nan.checks.watch_result import Check
from debug_nan.integrations.session import FrameworkMonitor
from debug_nan.launch.hooks import RunStopped
from debug_nan.train.outcome import MicroOutcome
from debug_nan.train.session import StepSession


@dataclass
class Trip:
    """Where the watch tripped: the micro-batch (or, optimizer=True, the optimizer step of `step`) to trace."""

    step: int
    micro: int
    check: Check | None
    error: BaseException | None
    optimizer: bool
    batch: object  # the micro-batch's model inputs, as captured
    first_ranks: list[int] | None = None  # under torchrun: the ranks that saw it in the earliest phase
    phase: str | None = None  # ... and that phase (train/agreement.py's rule: the earliest wins)


class RunHistory(History):
    """The history, with every micro-batch's loss (float64, in run order) for the re-execution's comparison and
    the last micro-batch's result, whose gradient norms are the step's once the optimizer steps."""

    def __init__(self):
        super().__init__()
        self.losses = array("d")
        self.last = None

    def add_micro(self, rec, result, last: bool) -> None:
        super().add_micro(rec, result, last)
        loss = result.loss()
        self.losses.append(math.nan if loss is None else loss)
        self.last = result

    def close(self, rec) -> None:
        """The step's optimizer step came: its gradient norms are those of its last micro-batch (accumulated)."""
        self.step_gradients(rec, self.last)
        rec.finish()


class RunSession(StepSession):
    """The session, pinpointing by re-execution: a trip becomes `pending` instead of an in-process replay."""

    def __init__(self, driver, policies, watch=None):
        super().__init__(driver, policies, watch)
        self.history = RunHistory()
        self.pending: Trip | None = None
        self.overflow_skipped = False

    def decide(self, o: MicroOutcome):
        """Under torchrun every rank stops at the micro-batch the ranks agreed on, the ones that did not see the
        harm first too (the agreement pinpoints on the first ones only): all re-execute it together."""
        self.overflow_skipped = False
        finding = super().decide(o)
        codes = o.rank_codes
        if self.p.agreement is None or not codes or max(codes) == 0 or self.overflow_skipped:
            return finding
        top = max(codes)
        first = [r for r, c in enumerate(codes) if c == top]
        if self.pending is None and finding is None:
            self.pinpoint(o)
            if self.pending is None:  # a parameter check with no step before it: nothing to re-execute
                return finding
        if self.pending is not None:
            self.pending.first_ranks, self.pending.phase = first, CODE_PHASE[int(top)]
            if top == PHASE_CODE["param"]:  # every rank's own check read the same replicated parameters
                self.pending.optimizer = True
        return finding

    def pinpoint(self, o: MicroOutcome, trace: bool = True):
        if o.check is not None and o.check.kind == "param":
            if o.previous is None:
                return None
            inputs, micro, optimizer = o.previous, len(o.previous.batches), True
        else:
            inputs, micro, optimizer = o.inputs, o.micro, False
        self.pending = Trip(inputs.step, micro, o.check, o.error, optimizer, inputs.batches[micro - 1])
        self.stop(None)
        return None

    def is_scaler_overflow(self, o: MicroOutcome) -> bool:
        """fp16 with a GradScaler, only the gradients non-finite: while the scale is at least 1 this is taken for
        the scaler's overflow (it skips the step and lowers the scale; no probe without the scale here, which
        would need the script's loss code); below 1 it is a finding."""
        if self.scaler is None:
            return False
        return o.record.scaler_skipped or self.scaler.get_scale() >= 1.0

    def skip_overflow(self, o: MicroOutcome) -> None:
        self.overflow_skipped = True
        if not o.record.scaler_skipped:
            self.log(f"  [fp16] non-finite gradients at step {o.inputs.step} under a loss scale of "
                     f"{self.scaler.get_scale():g}: taken for the GradScaler's overflow (it skips the step and "
                     f"lowers the scale), not a finding.")
        o.record.scaler_skipped = True


class RunMonitor(FrameworkMonitor):
    framework = "script"
    session_class = RunSession
    snapshot_mode = "off"

    def __init__(self, model, optimizer, settings, log, dist_ctx=None):
        super().__init__(model, optimizer, settings, log, dist_ctx=dist_ctx)
        self.step_open = False

    def finish(self):
        """The last update's check. A script that destroyed its process group at its end cannot agree on it:
        the parameters are replicas under DDP, so every rank decides the same alone, and all re-execute."""
        group_gone = self.session.p.agreement is not None and not (dist.is_available() and dist.is_initialized())
        if group_gone:
            self.session.p.agreement = None
        finding = super().finish()
        if group_gone and self.pending is not None:
            self.pending.first_ranks = list(range(self.dist.world))
            self.pending.phase = CODE_PHASE[PHASE_CODE["param"]]
        return finding

    @property
    def pending(self) -> Trip | None:
        return self.session.pending

    def adopt_scaler(self, scaler) -> None:
        """The script's GradScaler, known at its first scale(): the gradients' norms are read unscaled."""
        if self.scaler is None and scaler is not None and scaler.is_enabled():
            self.scaler = self.session.scaler = scaler

    # -- StepDriver methods: nothing is replayed in this process ----------------------------------------------
    def replay_loss(self, batch):
        raise NotImplementedError("debug-nan run replays by re-executing the command")

    def backward(self, loss, scaled: bool = True) -> None:
        raise NotImplementedError("debug-nan run replays by re-executing the command")

    def optimizer_step(self) -> None:
        raise NotImplementedError("debug-nan run replays by re-executing the command")

    # -- the hooks' events -------------------------------------------------------------------------------------
    def micro_begin(self, batch, step: int) -> None:
        self.begin(batch, first=not self.step_open, step=step)
        self.step_open = True

    def backward_begin(self, loss: torch.Tensor) -> None:
        if self.watch.enabled and loss.numel() == 1:
            self.watch_loss(loss.reshape(()))

    def backward_end(self) -> None:
        self.end(last=False)
        if self.stopped:
            raise RunStopped("trip")

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
