"""A framework's driver of the step session (engine/session/session.py), at the points a framework's hooks reach.

    begin(batch, first)   before a micro-batch's forward (first: it opens an optimizer step)
    end(last)             after its backward: the session's one host sync and trip decision
    stepped()             after the optimizer step: the parameters are checked at the next sync
    finish()              after training: the last parameter check

A framework adapter subclasses FrameworkDriver (a SessionDriver, drivers/session_driver.py: the session built
once, "loss, scale, backward" and "unscale, clip, step" written once) and gives ITS step for the replay:
replay_loss(batch, tape) (the framework's own loss code for one micro-batch, on the bare module), and where the
framework differs, share_of_step / run_backward (its accumulation scaling, its backward call) and clip_gradients.
The protocol itself (watch, snapshot, fp16 probe, DDP agreement, explosion check, replay, bundle) is the session's,
the same as the CLI's and the Monitor's.

On a trip the model is put back to the last finite state (the snapshot before the failing micro-batch, or before
the update that made a parameter non-finite) with no gradients, so the optimizer step the framework may still
take changes nothing and a checkpoint it may still save is finite.
"""

from __future__ import annotations

import torch

from debug_nan.drivers.session_driver import SessionDriver
from debug_nan.drivers.task import split_loss
from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.replay.driver import TaskFailure
from debug_nan.engine.session.agreement import FoundElsewhere, RankAgreement, RunAborted
from debug_nan.presentation.bundle import write_bundle
from debug_nan.settings import RunSettings


class FrameworkDriver(SessionDriver):
    framework = "framework"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, settings: RunSettings, log,
                 scaler=None, dist_ctx=None, bundle_dir: str | None = None, scheduler=None):
        self.model, self.optimizer, self.log = model, optimizer, log
        self.device = next(model.parameters()).device
        self.s, self.dist = settings, dist_ctx
        self.accumulation_steps = settings.accumulation_steps
        self.bundle_dir = bundle_dir
        self.open_session(
            settings.watch, scaler=scaler,
            agreement=RankAgreement(dist_ctx, self.device, log) if dist_ctx else None,
            # the framework's backward on the other ranks may already be inside a gradient all-reduce: an
            # exception is decided by the rank that raised, alone
            agree_on_errors=False, bundle_sink=self.write_bundle if bundle_dir is not None else None,
            scheduler=scheduler)
        self.watch.enabled = False  # on only inside a training micro-batch
        self.findings: list[Finding] = []
        self.notes: list[str] = []
        self.error: str | None = None  # user code raised and the replay found no NaN/Inf behind it
        self.steps_run = 0

    def write_bundle(self, state: dict) -> str:
        """A finding's repro bundle (engine/session/repro.py's state) written into bundle_dir -> its path."""
        return str(write_bundle(self.bundle_dir, state))

    @property
    def stopped(self) -> bool:
        return self.session.stopped

    @stopped.setter
    def stopped(self, value: bool) -> None:
        self.session.stopped = value
        if value:
            self.watch.enabled = False

    # -- the micro-batch ---------------------------------------------------------------------------------------
    def begin(self, batch, first: bool, step: int | None = None) -> None:
        """Before a micro-batch's forward. `step`: the framework's optimizer step number (1-based), if known."""
        if self.stopped:
            return
        if first or self.session.inputs is None:
            self.session.begin_step(step)
        self.session.begin_micro(batch)

    def watch_loss(self, loss) -> None:
        self.session.watch_loss(*split_loss(loss))

    def end(self, last: bool, error: BaseException | None = None) -> Finding | None:
        """After a micro-batch's backward (or after user code raised in it): sync, then trip or not. Returns the
        finding of a trip (the run is then stopped and the model at its last finite state); None otherwise, and
        also when user code raised and the replay found no NaN/Inf behind it (the caller lets it propagate)."""
        if self.stopped or self.session.inputs is None or not self.watch.enabled:
            return None
        return self._settle(lambda: self.session.end(last, error), last)

    def stepped(self) -> None:
        """After the optimizer step: check the parameters and optimizer state (read at the next sync)."""
        self.session.stepped()

    def finish(self) -> Finding | None:
        """After training: the last optimizer step's parameter check (one more sync), then detach the hooks."""
        finding = None if self.stopped else self._settle(self.session.finish, last=False)
        self.close()
        self.stopped = True
        return finding

    def read_update(self) -> Finding | None:
        """The last update's parameter check, now; a finding stops the run as at any trip."""
        return None if self.stopped else self._settle(self.session.finish, last=False)

    def close(self) -> None:
        self.watch.close()

    def _settle(self, decide, last: bool) -> Finding | None:
        """Run the session's decision; a finding (or a failure to replay) stops the run."""
        try:
            finding = decide()
        except FoundElsewhere as told:  # a rank's finding outside training: every rank stops with it, as it is
            if not any(f is told.finding for f in self.findings):  # (the rank that made it has it already)
                self.findings.append(told.finding)
            self.stopped = True
            self.session.watch.discard()
            return told.finding
        except (TaskFailure, RunAborted) as failure:
            self.error = str(failure)
            self.session.stop(None)
            return None
        if last:
            self.steps_run = self.session.steps
        if finding is None:
            return None
        self.findings.append(finding)
        self.steps_run = max(self.steps_run, finding.step)
        return self.session.stop(finding)
