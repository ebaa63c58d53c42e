"""The watch in the user's own run: the framework step protocol (FrameworkMonitor) driven by the global hooks.

A trip is not replayed here (the code between the root forward and the backward is the user's, which cannot be
called again in this process): it is recorded as a `Trip`, the script is stopped, and the pinpoint re-executes
the command (launch/reexec.py). So the snapshots are off (the re-execution rebuilds the state from the start),
and the per-micro-batch losses are kept, to tell a re-execution that diverged from this run.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass

import torch

from debug_nan.checks.finding import Finding
from debug_nan.checks.history import History
from debug_nan.checks.snapshot import Snapshot
from debug_nan.checks.watch_result import Check
from debug_nan.integrations.session import FrameworkMonitor
from debug_nan.launch.hooks import RunStopped


@dataclass
class Trip:
    """Where the watch tripped: the micro-batch (or, optimizer=True, the optimizer step of `step`) to trace."""

    step: int
    micro: int
    check: Check | None
    error: BaseException | None
    optimizer: bool
    batch: object  # the micro-batch's model inputs, as captured


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
        grads = self.last.values("grad") if self.last is not None else {}
        rec.grad_norms = grads
        if grads:
            rec.grad_norm = math.sqrt(sum(v * v for v in grads.values()))
        rec.finish()


class RunMonitor(FrameworkMonitor):
    framework = "script"

    def __init__(self, model, optimizer, settings, log):
        super().__init__(model, optimizer, settings, log)
        for snapshot in self.snapshots:  # the base class's host copies: not needed, the re-execution replays
            if hasattr(snapshot, "_hook"):
                snapshot._hook.remove()
        self.snapshots = [Snapshot(model, optimizer, mode="off") for _ in range(2)]
        self.history = RunHistory()
        self.pending: Trip | None = None
        self.step_open = False

    # -- StepDriver methods: nothing is replayed in this process ----------------------------------------------
    def replay_loss(self, batch):
        raise NotImplementedError("debug-nan run replays by re-executing the command")

    def backward(self, loss, scaled: bool = True) -> None:
        raise NotImplementedError("debug-nan run replays by re-executing the command")

    def optimizer_step(self) -> None:
        raise NotImplementedError("debug-nan run replays by re-executing the command")

    def scaler_overflow(self, probe: bool | None = None) -> bool:
        """fp16 with a GradScaler, only the gradients non-finite: while the scale is at least 1 this is taken for
        the scaler's overflow (it skips the step and lowers the scale; no probe without the scale here, which
        would need the script's loss code); below 1 it is a finding."""
        if self.scaler is None:
            return False
        if self.rec.scaler_skipped:
            return True
        scale = self.scaler.get_scale()
        if scale < 1.0:
            return False
        self.rec.scaler_skipped = True
        self.log(f"  [fp16] non-finite gradients at step {self.steps} under a loss scale of {scale:g}: taken for "
                 f"the GradScaler's overflow (it skips the step and lowers the scale), not a finding.")
        return True

    # -- decisions ---------------------------------------------------------------------------------------------
    def trip(self, bad, error: BaseException | None) -> Finding | None:
        """Record what to trace and stop watching; the caller stops the script."""
        if bad is not None and bad.kind == "param":
            if self._previous is None:
                return None
            inputs, micro, optimizer = self._previous, len(self._previous.batches), True
        else:
            inputs, micro, optimizer = self.inputs, self.micro, False
        self.pending = Trip(inputs.step, micro, bad, error, optimizer, inputs.batches[micro - 1])
        self.steps_run = max(self.steps_run, inputs.step)
        self._halt()
        return None

    def stop(self, finding: Finding | None, snapshot) -> Finding | None:
        """A finding without a replay (the gradient history): kept; the process ends, so nothing is restored."""
        if finding is not None:
            self.findings.append(finding)
            self.steps_run = max(self.steps_run, finding.step)
        self._halt()
        return finding

    def _halt(self) -> None:
        self.stopped = True
        self.watch.enabled = False
        self.watch.discard()

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
        self.rec.scaler_skipped = self.rec.scaler_skipped or skipped
        self.history.close(self.rec)
        self.steps_run = self.steps
        if self.check_explosion() is not None:
            raise RunStopped("trip")
        if not skipped:
            self.stepped()
