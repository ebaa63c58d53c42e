"""One step session: the protocol of a micro-batch and an optimizer step, the same under every entry point.

    inputs = session.begin_step(step)          stage the snapshot, open the step's history record
    session.begin_micro(raw_batch)             capture the batch (before user code) and its RNG state, watch it
        ... the driver runs forward + loss (session.watch_loss) + backward (session.watch_grads, optional) ...
    outcome = session.end_micro(last, error)   the gradients' norms, the ONE host sync, the history
    finding = session.decide(outcome)          trip or not: fp16 overflow probe, DDP agreement, pinpoint + bundle,
                                               and after a clean last micro-batch the explosion check
    session.stepped()                          after the optimizer step: its parameters are read at the next sync
    finding = session.finish()                 after training: the last update's check

The CLI's Trainer, the API's Monitor and the Lightning / HF callbacks are thin drivers of this class: they run
their framework's step and call these verbs at its hook points. Each driver is also the pinpointer's StepDriver
(replay_loss, backward, optimizer_step: ITS step, replayed). What differs between entry points is passed in as
policies (`SessionPolicies`): the fp16 loss scaler and who skips a step it overflowed, the DDP agreement, the bundle
sink, the explosion thresholds and the advice's dialect. A new check is added here (and in engine/watch/watch.py), once.
"""

from __future__ import annotations

import math

import torch

from debug_nan.engine.explain.evidence import explosion_finding
from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.replay.driver import StepInputs
from debug_nan.engine.replay.pinpoint import Pinpointer
from debug_nan.engine.replay.snapshot import Snapshot, capture_rng
from debug_nan.engine.session.agreement import FindingHeld
from debug_nan.engine.session.copies import StateCopies, live_state_kept
from debug_nan.engine.session.outcome import MicroOutcome
from debug_nan.engine.session.output_schedule import OutputSchedule
from debug_nan.engine.session.policies import SessionPolicies
from debug_nan.engine.session.precision import SkipRun, may_overflow, unscaled
from debug_nan.engine.session.repro import repro_state
from debug_nan.engine.session.unreplayed import interrupted_pinpoint, unreplayed_finding
from debug_nan.engine.sharded import has_fsdp
from debug_nan.engine.stats import capture_batch
from debug_nan.engine.vocabulary import CheckKind, Phase, adapt_advice
from debug_nan.engine.watch.history import History, StepRecord
from debug_nan.engine.watch.watch import Watch


SHARDED_UPDATE = ("the model is sharded (FSDP): the op-level tracer does not follow an optimizer step over sharded "
                  "parameters (DTensors) yet")


class StepSession:
    def __init__(self, driver, policies: SessionPolicies, watch: Watch | None = None):
        self.driver, self.p = driver, policies
        self.model, self.optimizer, self.device = driver.model, driver.optimizer, driver.device
        self.log = driver.log
        self.scaler = policies.scaler
        self.watch = watch or Watch(self.model, self.optimizer)
        self.sharded = has_fsdp(self.model)
        if policies.agreement is not None:  # FSDP: a trip is replayed on every rank together (agreement.py)
            policies.agreement.together = self.sharded
        # one snapshot: step k + 1 saves into it only once its first sync found step k's update finite
        self.snapshot = Snapshot(self.model, self.optimizer, self.scaler, policies.scheduler, policies.snapshot_mode)
        self.pinpointer = Pinpointer(driver)
        self.history = History()
        self.inputs: StepInputs | None = None  # the step under way
        self.previous: StepInputs | None = None  # the step whose update the next sync checks
        self.copies = StateCopies(self.snapshot, driver, self.watch, self.log, policies.snapshot_every,
                                  adaptive=self.device.type == "cpu", distributed=policies.agreement is not None)
        self.outputs = OutputSchedule(policies.outputs_every, adaptive=self.device.type == "cpu", log=self.log)
        self.record: StepRecord | None = None
        self.skips = SkipRun()  # the steps the GradScaler skipped one after the other (one log line)
        self.micro = 0
        self.steps = 0
        self._grads_watched = False
        self._unread_update = False  # an optimizer step was taken since the parameters were last read
        self._trip_target: StepInputs | None = None  # the step whose start a trip needs (set by pinpoint)
        self.stopped = False
        self.held: Finding | None = None  # DDP: this rank's finding outside training, told at the next agreed sync

    # -- a step --------------------------------------------------------------------------------------------------
    def begin_step(self, step: int | None = None) -> StepInputs:
        """Before an optimizer step's first micro-batch. `step`: its number (1-based; default: the next one)."""
        self.steps = step if step is not None else self.steps + 1
        self._read_update()  # the last update, as this step finds the state
        if self.record is not None and not self.record.scaler_skipped:
            self.skips.end(self.log)
        self._trip_target = None
        self.inputs = self.copies.begin(self.steps)  # (the buffers staged as the forward finds them)
        measure = self.outputs.begin()
        self.watch.measure_outputs, self.watch.hook_seconds, self.watch.hook_calls = measure, 0.0, 0
        self.record = self.history.begin(self.steps, outputs_measured=measure or self.watch.detailed)
        self.record.lr = self.optimizer.param_groups[0]["lr"] if self.optimizer is not None else None
        self.micro = 0
        return self.inputs

    def begin_micro(self, raw_batch, on_device=None) -> None:
        """Before a micro-batch's forward: the batch as produced, before any user code can change it in place
        (`on_device`: the same batch moved to the model's device, which the watch measures)."""
        self.micro += 1
        self.inputs.batches.append(capture_batch(raw_batch, self.device))
        self.inputs.rng.append(capture_rng(self.device))
        self._grads_watched = False
        self.watch.enabled = True
        self.watch.watch_batch(raw_batch if on_device is None else on_device)

    def watch_loss(self, loss: torch.Tensor, parts: dict[str, torch.Tensor] | None = None) -> None:
        if self.watch.enabled:
            self.watch.watch_loss(loss, parts)

    def watch_grads(self) -> list[torch.Tensor] | None:
        """The gradients' L2 norms (on the device), divided by the fp16 loss scale while they are still scaled."""
        self._grads_watched = True
        return self.watch.watch_grads(self._inverse_scale())

    def _inverse_scale(self) -> torch.Tensor | None:
        s = self.scaler
        if s is None or getattr(s, "_scale", None) is None or self.optimizer is None or unscaled(s, self.optimizer):
            return None
        return s._scale.reciprocal()

    def end_micro(self, last: bool, error: BaseException | None = None, abort: BaseException | None = None,
                  grad_norms: list[torch.Tensor] | None = None) -> MicroOutcome:
        """After a micro-batch's backward (or after its code raised): the one host sync (agreed under DDP), the
        history; the snapshot is saved after the first micro-batch unless that sync blames the last update."""
        if abort is None and self.held is not None:  # (a finding of this rank outside training: told now)
            abort = FindingHeld(self.held)
        o = MicroOutcome(self.inputs, self.micro, error=error, abort=abort, record=self.record,
                         previous=self.previous, last=last)
        o.grad_norms = grad_norms if self._grads_watched else self.watch_grads()
        agreement = self.p.agreement
        agree = agreement.agree_codes if agreement is not None and (error is None or self.p.agree_on_errors) \
            else None
        result = self.watch.sync(agree, raised=error is not None, abort=abort is not None)
        self.watch.enabled = False
        if abort is None:
            self.history.add_micro(self.record, result, last)
        if self.scaler is not None and self.micro == 1:  # once per step, after the sync (nothing queued: ~free)
            self.record.loss_scale = self.scaler.get_scale()
        if last:
            self.record.finish()
        o.check, o.rank_codes, o.layer_stats = result.first_harm(), result.rank_codes, result.layer_stats
        o.new_buffers = result.new_nonfinite_buffers  # not harm by itself: traced in after_clean
        if self.micro == 1:
            self.copies.first_sync(result, o.blames_last_update)
        return o

    def end(self, last: bool, error: BaseException | None = None) -> Finding | None:
        """end_micro + decide, for the drivers that take no decision of their own."""
        return self.decide(self.end_micro(last, error))

    def stepped(self) -> None:
        """After the optimizer step: the parameters and optimizer state are read as the next step begins (after
        whatever else the loop does to them: an EMA, a clamp) and checked at its first sync."""
        if self.stopped or self.inputs is None:
            return
        self._unread_update = True
        self.previous = self.inputs
        self.copies.stepped()
        if not self.watch.detailed:  # (--trace-every-step measures every step, and its per-layer syncs are not
            # what measuring outputs costs otherwise)
            self.outputs.stepped(self.watch.hook_seconds, self.watch.hook_calls)

    def follow(self, optimizer, scheduler=None) -> None:
        """The driver's optimizer was replaced (a second training stage), as its first step begins: the watch reads
        the new one's state, and the copies start anew with it from the live state."""
        self.optimizer = self.watch.optimizer = optimizer
        self.p.scheduler = scheduler
        self.snapshot = Snapshot(self.model, optimizer, self.scaler, scheduler, self.p.snapshot_mode)
        current = self.copies.current
        self.copies = StateCopies(self.snapshot, self.driver, self.watch, self.log, self.p.snapshot_every,
                                  adaptive=self.device.type == "cpu", distributed=self.p.agreement is not None)
        if current is not None and self.inputs is current:  # mid-step, before the new optimizer's first update:
            # the live parameters are this step's start (its buffers as the forward left them)
            self.copies.current = current
            self.snapshot.save(live_buffers=True)
            self.copies.saved = current
        for inputs in (self.inputs, self.previous):
            if inputs is not None:
                inputs.snapshot = self.snapshot

    @property
    def update_unread(self) -> bool:
        """An optimizer step was taken since the parameters were last read (finish() reads them now)."""
        return self._unread_update

    def _read_update(self) -> None:
        if self._unread_update:
            self.watch.watch_params()
            self._unread_update = False

    def finish(self) -> Finding | None:
        """After training: the last optimizer step's parameter check (one more sync, agreed under DDP)."""
        self.skips.end(self.log)
        if self.stopped or self.previous is None:
            return None
        last = self.previous
        self._read_update()
        held = FindingHeld(self.held) if self.held is not None and self.p.agreement is not None else None
        result = self.watch.sync(self.p.agreement.agree_codes if self.p.agreement is not None else None,
                                 abort=held is not None)
        self.copies.read(result)  # (an eval pass may follow, then more steps: their copies need this reading)
        return self.decide(MicroOutcome(last, len(last.batches), result.first_harm(), rank_codes=result.rank_codes,
                                        previous=last, abort=held))

    # -- the trip decision ---------------------------------------------------------------------------------------
    def decide(self, o: MicroOutcome) -> Finding | None:
        """Trip or not, from one micro-batch's checks (under DDP: the same decision on every rank)."""
        if self.p.agreement is not None and o.rank_codes is not None:
            finding = self.decide_together(o)
            if finding is not None and finding.rank == self.p.agreement.ctx.rank:
                self.save_bundle(finding, o)
            return finding if finding is not None else self.after_clean(o)
        if o.check is None and o.error is None:
            return self.after_clean(o)
        if o.only_gradients and o.record is not None and self.is_scaler_overflow(o):
            return self.skip_overflow(o)
        self.skips.end(self.log)
        finding = self.pinpoint(o)
        self.save_bundle(finding, o)
        return finding

    def decide_together(self, o: MicroOutcome) -> Finding | None:
        """Under DDP, the same decision on every rank (engine/session/agreement.py): who saw the earliest phase,
        the fp16 overflow verdict, each replaying rank's pinpoint, the one finding reported."""
        agreement = self.p.agreement
        if (plan := agreement.plan(o)) is None:
            return None
        if plan.gradients_only and self.scaler is not None and o.record is not None:
            # the ranks whose own gradients tripped probe them without the loss scale; all agree on the verdict
            plan = agreement.overflow_verdict(plan, o.check is not None and not self.is_scaler_overflow(o))
            if plan is None:
                return self.skip_overflow(o)
        self.skips.end(self.log)
        agreement.announce(plan)
        replays, traces = plan.replays(agreement.ctx.rank)
        outcome = None
        try:
            if replays and not o.harmed:  # FSDP: its replay takes part in the tripping ranks' collectives
                if self.copies.at(o.inputs).ok:  # (a replay needs the copy of this step, as theirs does)
                    self.pinpointer.take_part(o.inputs, o.micro)
            else:
                outcome = self.pinpoint(o, traces) if replays else None
        except BaseException as exc:  # noqa: BLE001 - the other ranks wait for this rank's answer
            outcome = agreement.failure(exc, agreement.ctx.rank)
        return agreement.report(plan, outcome)

    def after_clean(self, o: MicroOutcome) -> Finding | None:
        """A clean micro-batch: the op that wrote a buffer that turned non-finite is traced while this step can be
        replayed; on the last one, the averaged gradients' norms (DDP), then the explosion check."""
        if o.new_buffers:
            self.copies.at(o.inputs)  # (mid-step: a copy of the live state; none without a snapshot)
        self.pinpointer.trace_buffer_writers(o.inputs, o.micro, o.new_buffers)
        if not o.last or o.record is None or o.record.scaler_skipped or max(o.rank_codes or [0]) > 0:
            return None
        if self.p.averaged_after_watch and self.p.agreement is not None:
            o.grad_norms = self.p.agreement.gradient_norms(self.watch.named_params, o.record)
        return self.check_explosion(o.record)

    def is_scaler_overflow(self, o: MicroOutcome) -> bool:
        """fp16: only the gradients went non-finite under the loss scale. An overflow (the step is skipped and the
        scale lowered) when the same micro-batches give finite gradients at scale 1 (the probe: they are replayed
        without the scale); at a scale of 1 or below it is never one (precision.may_overflow). With --snapshot off
        nothing can be re-run: the trip counts as the scaler's overflow, as GradScaler takes it."""
        if self.scaler is None:
            return False
        if o.record.scaler_skipped:  # already known for this step: the later micro-batches inherit the Inf
            return True
        if not self.snapshot.kept:
            return True
        if not may_overflow(self.scaler):
            return False
        self.copies.at(o.inputs)  # mid-step: a copy of the live state
        with live_state_kept(self.model, self.snapshot, self.device, self.scaler):
            return self.pinpointer.finite_without_scaling(o.inputs, o.micro)

    def skip_overflow(self, o: MicroOutcome) -> Finding | None:
        """The step is the GradScaler's to skip (it lowers its scale); a long run of skips is a finding (SkipRun)."""
        skipped, o.record.scaler_skipped = o.record.scaler_skipped, True
        finding = None if skipped else self.skips.add(o, self.scaler)
        return adapt_advice(finding, self.p.dialect) if finding is not None else None

    def check_explosion(self, record: StepRecord) -> Finding | None:
        if self.p.explosion is None:
            return None
        threshold, growth = self.p.explosion
        if (hit := self.history.explosion(threshold, growth)) is None:
            return None
        self.log(f"  [watch] TRIP at step {record.step}: gradient norm {record.grad_norm:.4g} (explosion)", "red")
        finding = explosion_finding(record, hit[1], self.history.steps, self.micro, threshold, self.model)
        if self.p.agreement is not None:  # (every rank is here at the same step: the norms are the same on all)
            self.p.agreement.name_explosion(finding, self.history.steps)
        return adapt_advice(finding, self.p.dialect)

    def pinpoint(self, o: MicroOutcome, trace: bool = True) -> Finding | None:
        """The finding behind a trip; a parameter trip is the previous step's optimizer update."""
        if (trip := o.trip) is None:
            return None
        snap = self.snapshot
        self._trip_target = trip.inputs
        kind = trip.check.kind if trip.check is not None else None
        replayable = snap.kept and kind != CheckKind.DATA and (not trip.optimizer or snap.keeps_optimizer)
        try:
            why = (SHARDED_UPDATE if trip.optimizer and self.sharded else self.copies.at(trip.inputs).why) \
                if replayable else ""  # (for an update: a re-run, maybe)
            if (kind != CheckKind.DATA and not replayable) or why:
                finding = unreplayed_finding(trip, self.model, self.log, snap.kept, why)
            else:
                finding = self.pinpointer.pinpoint(trip, trace=trace)
        except KeyboardInterrupt as exc:
            if trip.check is None:
                raise
            raise interrupted_pinpoint(exc, trip, self.model) from None
        return adapt_advice(finding, self.p.dialect) if finding is not None else None

    def save_bundle(self, finding: Finding | None, o: MicroOutcome) -> None:
        """The finding's repro bundle, written by the rank that pinpointed (the state is read from the snapshot)."""
        if finding is None or self.p.bundle_sink is None or finding.detected_by == "gradient history":
            return
        if self.p.agreement is not None and self.p.agreement.together:  # (its state dict is a collective too)
            self.log("  [bundle] no repro bundle: the model is sharded (FSDP), and its replay needs every rank's "
                     "shards and process group, which a bundle replayed alone does not have.", "yellow")
            return
        trip = o.trip
        optimizer = trip is not None and trip.optimizer and finding.phase == Phase.OPTIMIZER
        inputs, micro = (trip.inputs, trip.micro) if optimizer else (o.inputs, o.micro)
        if not self.copies.at(inputs).ok:  # (no snapshot kept, or a re-run to it that failed)
            return
        try:
            finding.bundle = self.p.bundle_sink(repro_state(self.driver, inputs, micro, finding, o.check, optimizer))
            self.log(f"  [bundle] repro bundle written: {finding.bundle} (debug-nan replay {finding.bundle})")
        except Exception as exc:  # noqa: BLE001 - the finding matters more than its bundle
            self.log(f"  [bundle] could not write the repro bundle: {type(exc).__name__}: {exc}", "yellow")

    # -- ending --------------------------------------------------------------------------------------------------
    def stop(self, finding: Finding | None) -> Finding | None:
        """Leave the model at its last finite state with no gradients, and watch no more: the start of the failing
        step, or, where that could not be rebuilt (a re-run that did not reproduce the run), the last copy."""
        self.skips.end(self.log)
        if self.snapshot.kept and self.copies.saved is not None and not self._back_to_start():
            self.snapshot.restore()
            self.log(f"  [snapshot] the model is left at the start of step {self.copies.saved.step} (the last copy): "
                     f"the state before the failing step could not be rebuilt", "yellow")
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self.scaler is not None and params:
            # a step the framework may still take goes through scaler.step, which needs a gradient to inspect:
            # one NaN makes it skip the update, as for any overflow
            params[0].grad = torch.full_like(params[0], math.nan)
        self.stopped = True
        self.watch.enabled = False
        self.watch.discard()
        return finding

    def undo_update(self) -> bool:
        """--keep-going: back to the state before the failing step, as if its update had not been taken (the next
        step saves a new copy) -> False, with nothing changed, when that state could not be rebuilt: going on from
        an older copy would drop the updates since, so the run must stop."""
        if not self._back_to_start():
            return False
        self.previous = None
        self.copies.forget()
        return True

    def _back_to_start(self) -> bool:
        """Restore the start of the failing step (the trip's: a parameter trip's is the previous step, whose
        pinpoint brought the copy there; any other trip is mid-step, where the live state is that start, copied
        now unless the pinpoint did) -> whether the copy holds it."""
        target = self._trip_target or self.inputs
        if target is None or not self.copies.at(target).ok:
            return False
        self.snapshot.restore()
        return True

__all__ = ["StepSession"]
