"""The Monitor split at the points a framework's hooks reach, with its accumulation and loss scaler.

    begin(batch, first)   before a micro-batch's forward (first: it opens an optimizer step -> snapshot)
    end(last)             after its backward: the one host sync, then trip or not
    stepped()             after the optimizer step: the parameters are checked at the next sync
    finish()              after training: the last parameter check

A framework adapter subclasses FrameworkMonitor and implements the StepDriver methods for ITS step, for the
replay: replay_loss(batch) (the framework's own loss code for one micro-batch, on the bare module), backward(loss,
scaled) (its accumulation scaling and loss scaler) and optimizer_step() (unscale, its clipping, the optimizer).
Everything else (watch, snapshots, replay, diagnosis, summary, report, bundle) is the CLI's own code.

On a trip the model is put back to the last finite state (the snapshot before the failing micro-batch, or before
the update that made a parameter non-finite) with no gradients, so the optimizer step the framework may still
take changes nothing and a checkpoint it may still save is finite.
"""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch

from debug_nan.api import Monitor
from debug_nan.checks.driver import StepInputs, TaskFailure
from debug_nan.checks.finding import Finding, explosion_finding
from debug_nan.checks.history import History
from debug_nan.checks.snapshot import capture_rng, restore_rng
from debug_nan.checks.stats import capture_batch
from debug_nan.integrations.ddp import decide_across_ranks
from debug_nan.report.bundle import write_bundle
from debug_nan.settings import RunSettings
from debug_nan.train.distributed import agree, average_gradients
from debug_nan.train.repro import repro_state

HISTORY_STEPS = 50  # steps kept for the report and the explosion check: a long run must not grow without bound


def _agree_over(ctx):
    """The watch's `agree` callable for a DDP context (None outside DDP)."""
    return (lambda code: agree(code, ctx)) if ctx is not None else None


class FrameworkMonitor(Monitor):
    framework = "framework"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, settings: RunSettings, log,
                 scaler=None, dist_ctx=None, bundle_dir: str | None = None):
        super().__init__(model, None, optimizer, log)
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        for snapshot in self.snapshots:  # the base class's two snapshots, told about the framework's scaler
            snapshot.scaler = self.scaler
        self.s, self.dist, self.bundle_dir = settings, dist_ctx, bundle_dir
        self.accumulation_steps = settings.gradient_accumulation_steps
        self.history = History()
        self.inputs: StepInputs | None = None
        self.micro = 0
        self.rec = None
        self.findings: list[Finding] = []
        self.notes: list[str] = []
        self.error: str | None = None  # user code raised and the replay found no NaN/Inf behind it
        self.stopped = False
        self.steps_run = 0

    # -- StepDriver methods the framework adapter implements (replay_loss, backward, optimizer_step) -----------
    def average_gradients(self) -> None:
        if self.dist is not None:
            average_gradients(self.watch.named_params, self.dist)

    # -- the micro-batch ---------------------------------------------------------------------------------------
    def begin(self, batch, first: bool, step: int | None = None) -> None:
        """Before a micro-batch's forward. `step`: the framework's optimizer step number (1-based), if known."""
        if self.stopped:
            return
        if first or self.inputs is None:
            self.steps = step if step is not None else self.steps + 1
            self.inputs = StepInputs(step=self.steps, batches=[], rng=[], snapshot=self.snapshots[self.steps % 2])
            self.inputs.snapshot.save()
            self.rec = self.history.begin(self.steps)
            self.rec.lr = self.optimizer.param_groups[0]["lr"]
            del self.history.steps[:-HISTORY_STEPS]
            self.micro = 0
        self.micro += 1
        self.inputs.batches.append(capture_batch(batch, self.device))
        self.inputs.rng.append(capture_rng(self.device))
        self.watch.enabled = True
        self.watch.watch_batch(batch)

    def end(self, last: bool, error: BaseException | None = None) -> Finding | None:
        """After a micro-batch's backward (or after user code raised in it): sync, then trip or not. Returns the
        finding of a trip (the run is then stopped and the model at its last finite state); None otherwise, and
        also when user code raised and the replay found no NaN/Inf behind it (the caller lets it propagate)."""
        if self.stopped or self.inputs is None or not self.watch.enabled:
            return None
        self.watch.watch_grads()
        self.watch.enabled = False
        local = self.dist if error is None else None  # an exception is never agreed on: see integrations.ddp
        result = self.watch.sync(_agree_over(local))
        self.history.add_micro(self.rec, result, last)
        if last:
            self.rec.finish()
            self.steps_run = self.steps
        bad = result.first_harm()
        if local is not None:
            return decide_across_ranks(self, result, bad, last)
        if bad is None and error is None:
            return self.check_explosion() if last else None
        if error is None and bad.kind == "grad" and self.scaler_overflow():
            return None
        return self.trip(bad, error)

    def stepped(self) -> None:
        """After the optimizer step: check the parameters and optimizer state (read at the next sync)."""
        if self.stopped or self.inputs is None:
            return
        self.watch.watch_params()
        self._previous = self.inputs

    def watch_loss(self, loss) -> None:
        if self.watch.enabled:
            super().watch_loss(loss)

    # -- decisions ---------------------------------------------------------------------------------------------
    def scaler_overflow(self, probe: bool | None = None) -> bool:
        """fp16: only the gradients went non-finite under the loss scale. An overflow (the framework skips the
        step and lowers the scale) when the same micro-batches give finite gradients without the scale."""
        if self.scaler is None:
            return False
        if self.rec.scaler_skipped:  # already known for this step: the later micro-batches inherit the inf
            return True
        if probe is None:
            probe = self.scaler.get_scale() >= 1.0 and self.probe_without_scaling()
        if probe:
            self.rec.scaler_skipped = True
            self.log(f"  [fp16] gradient scaler overflow at step {self.steps} (finite without the scale): the "
                     f"{self.framework} skips this step and lowers the scale (expected).")
        return probe

    def probe_without_scaling(self) -> bool:
        with self.live_state_kept():
            return self.pinpointer.finite_without_scaling(self.inputs, self.micro)

    def check_explosion(self) -> Finding | None:
        if self.rec.scaler_skipped:
            return None
        hit = self.history.explosion(self.s.explosion_threshold, self.s.explosion_growth)
        if hit is None:
            return None
        self.log(f"  [watch] TRIP at step {self.steps}: gradient norm {self.rec.grad_norm:.4g} (explosion)", "red")
        return self.stop(explosion_finding(self.rec, hit[1], self.history.steps, self.micro,
                                           self.s.explosion_threshold, self.model), self.inputs.snapshot)

    def trip(self, bad, error: BaseException | None) -> Finding | None:
        """Pinpoint this micro-batch (or, for a parameter, the previous optimizer step), write its bundle, stop."""
        try:
            if bad is not None and bad.kind == "param":
                if self._previous is None:
                    return None
                inputs, micro, optimizer = self._previous, len(self._previous.batches), True
                finding = self.pinpointer.pinpoint(inputs, micro, bad, None, optimizer=True)
            else:
                inputs, micro, optimizer = self.inputs, self.micro, False
                finding = self.pinpointer.pinpoint(inputs, micro, bad, error)
        except TaskFailure as failure:
            self.error = str(failure)
            return self.stop(None, self.inputs.snapshot)
        self.save_bundle(finding, inputs, micro, bad, optimizer)
        return self.stop(finding, inputs.snapshot)

    def save_bundle(self, finding: Finding, inputs: StepInputs, micro: int, check, optimizer: bool) -> None:
        if finding is None or self.bundle_dir is None:
            return
        try:
            # the CLI's repro_state: it needs only accumulation_steps, s and device from its driver
            state = repro_state(self, inputs, micro, finding, check, optimizer)
            finding.bundle = str(write_bundle(self.bundle_dir, state))
            self.log(f"  [bundle] repro bundle written: {finding.bundle}"
                     + (f" (debug-nan replay {finding.bundle})" if self.s.task else ""))
        except Exception as exc:  # noqa: BLE001 - the finding matters more than its bundle
            self.log(f"  [bundle] could not write the repro bundle to {self.bundle_dir}: "
                     f"{type(exc).__name__}: {exc}", "yellow")

    def stop(self, finding: Finding | None, snapshot) -> Finding | None:
        """Leave the model at its last finite state with no gradients, and watch no more."""
        if finding is not None:
            self.findings.append(finding)
            self.steps_run = max(self.steps_run, finding.step)
        snapshot.restore()
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.scaler is not None and params:
            # a step the framework may still take goes through scaler.step, which needs a gradient to inspect:
            # one NaN makes it skip the update, as for any overflow
            params[0].grad = torch.full_like(params[0], math.nan)
        self.stopped = True
        self.watch.enabled = False
        self.watch.discard()
        return finding

    def finish(self) -> Finding | None:
        """After training: the last optimizer step's parameter check (one more sync), then detach the hooks."""
        finding = None
        if not self.stopped and self._previous is not None:
            result = self.watch.sync(_agree_over(self.dist))
            bad = result.first_harm()
            if self.dist is not None:
                finding = decide_across_ranks(self, result, bad, last=False)
            elif bad is not None:
                finding = self.trip(bad, None)
        self.close()
        self.stopped = True
        return finding

    @contextmanager
    def live_state_kept(self):
        """Around a probe that re-runs the step while the framework goes on afterwards: its gradients, buffers,
        RNG and the scaler's per-step record come back exactly as they were."""
        params = list(self.model.parameters())
        grads = [p.grad for p in params]
        buffers = [b.detach().clone() for b in self.model.buffers()]
        rng = capture_rng(self.device)
        scaler_record = self.scaler._per_optimizer_states if self.scaler is not None else None
        try:
            yield
        finally:
            for p, g in zip(params, grads):
                p.grad = g
            with torch.no_grad():
                for b, saved in zip(self.model.buffers(), buffers):
                    b.copy_(saved)
            restore_rng(rng, self.device)
            if self.scaler is not None:
                self.scaler._per_optimizer_states = scaler_record
