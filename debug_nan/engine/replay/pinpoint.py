"""Tier 2 driver: turn a trip of the watch into a Finding.

Restore the snapshot from just before the failing step (parameters, buffers, training flags, optimizer, scaler,
scheduler), re-run the step's earlier micro-batches with their RNG states (so accumulated gradients match),
then replay the failing micro-batch under the operator-level Tracer through forward, loss, backward and, for a
parameter trip, the optimizer step. The tracer's first origin is diagnosed (tier 3). Everything runs through
the `StepDriver` seam, so the CLI's Trainer and the API's Monitor share this one replay.

State: a buffer the watch saw turn non-finite without harm is traced at once (trace_buffer_writers) and its
writer becomes the finding if later harm meets the buffer (buffer_writers.py); a non-finite state met in the run's
first step is the checkpoint's or the task's (start_state.py); an optimizer-phase origin is told with the step's
own param_groups (optimizer_evidence.py); a replay that fell short (not replayable, out of memory) or stayed finite
(replayed once more: transient or not) is told by fell_short.py.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from debug_nan.engine.explain.advice import AdviceContext, clipping_of
from debug_nan.engine.explain.explain import ReplayFacts, Trace, explain
from debug_nan.engine.explain.evidence import data_finding, watch_only_finding
from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.explain.optimizer_evidence import read_hyperparameters
from debug_nan.engine.replay.buffer_writers import BufferWriters, Written
from debug_nan.engine.replay.driver import (
    NotReplayable,
    StepDriver,
    StepInputs,
    TaskFailure,
    is_out_of_memory,
)
from debug_nan.engine.replay.live import LiveTrace
from debug_nan.engine.replay.snapshot import capture_rng, put_groups, restore_rng
from debug_nan.engine.replay.start_state import is_start_state, start_state_finding
from debug_nan.engine.replay.fell_short import (
    not_replayable_finding,
    out_of_memory_finding,
    replay_again,
    transient_finding,
)
from debug_nan.engine.replay.trip import Trip
from debug_nan.engine.sharded import has_fsdp, local
from debug_nan.engine.stats import flat_tensors, move_to, nonfinite_names
from debug_nan.engine.trace.events import has_nonfinite
from debug_nan.engine.trace.tracer import OpEvent, Tracer
from debug_nan.engine.vocabulary import CheckKind, Phase
from debug_nan.engine.watch.sampled import dataset_indices
from debug_nan.engine.watch.watch import Check, param_and_state_tensors
from debug_nan.errors import describe_exception


class Pinpointer:
    def __init__(self, driver: StepDriver):
        self.driver = driver
        self.writers = BufferWriters()  # buffers that went non-finite, and the op that wrote each
        self.facts = ReplayFacts()  # what the last replay saw besides its origin (engine/explain/explain.py)
        self.live: LiveTrace | None = None  # a micro-batch traced as it ran (`run --trace-at`), to explain at its trip
        self.sharded = has_fsdp(driver.model)  # FSDP: every replay runs the backward (its collectives) on every rank
        self.finite_values: list[torch.Tensor] = []  # the last replay's harmed values, when they stayed finite

    # -- replay -------------------------------------------------------------------------------------------------
    def _batch(self, inputs: StepInputs, index: int):
        """Micro-batch `index` (0-based) on the device, as a fresh copy: the replayed user code may change it in
        place and the next replay must still see it as produced."""
        return move_to(inputs.batches[index], self.driver.device, copy=True)

    def _rerun(self, inputs: StepInputs, count: int, scaled: bool) -> None:
        """From the snapshot, forward + backward of the step's first `count` micro-batches, each with its RNG
        state (with the fp16 loss scale, as in the run, or without it)."""
        d = self.driver
        inputs.snapshot.restore()
        for i in range(count):
            restore_rng(inputs.rng[i], d.device)
            loss, _ = d.replay_loss(self._batch(inputs, i), inputs.tape(i))
            d.backward(loss, scaled=scaled)

    def replay(self, inputs: StepInputs, micro: int, optimizer: bool = False, trace: bool = True):
        """Restore the snapshot and re-run the step up to the harm -> (tracer, harmed origin, exception, batch).

        A forward/backward trip: micro-batches 1..micro-1 plainly, `micro` under the tracer, its batch tensors
        marked as data origins; the loss is the harmed value when it is non-finite (no backward then), else the
        gradients. A parameter trip (optimizer=True): every micro-batch plainly (under DDP the gradients are
        averaged across the ranks, as in the run: every rank takes part, trace=False on all but the pinpointing
        one), then the optimizer step under the tracer, parameters and state marked first; the harmed values are
        the parameters and state after it. The origin is the earliest one in the harmed values' lineage. An
        out-of-memory error propagates."""
        d = self.driver
        exc = tracer = batch = origin = None
        read, named = None, None  # the replay's loss and gradients, read once the tracer is left
        with d.watch_paused():
            self._rerun(inputs, micro if optimizer else micro - 1, scaled=True)
            if optimizer:
                d.average_gradients()
            if not trace:
                return None, None, None, None
            self.facts = ReplayFacts()  # (nothing of an earlier replay's)
            if not optimizer:
                restore_rng(inputs.rng[micro - 1], d.device)
                batch = self._batch(inputs, micro - 1)
            with Tracer(d.model, poisoned=self.writers.names) as tracer:
                harmed: list = []
                try:
                    if optimizer:
                        tracer.phase_override = Phase.OPTIMIZER  # the lr this step uses, before its schedule step:
                        if inputs.step_groups is not None:
                            put_groups(d.optimizer, inputs.step_groups)
                        self.facts.hyper = (read_hyperparameters(d.optimizer, inputs.snapshot.scheduler)
                                       if d.optimizer is not None else None)
                        for name, t in param_and_state_tensors(d.model.named_parameters(), d.optimizer):
                            tracer.mark(local(t), name, "optimizer")
                        d.optimizer_step(inputs.update)
                        harmed = [local(t) for _, t in param_and_state_tensors(d.model.named_parameters(),
                                                                               d.optimizer)]
                    else:
                        for path, t in flat_tensors(batch):
                            tracer.mark(t, path, "data")
                        loss, parts = d.replay_loss(batch, inputs.tape(micro - 1))
                        harmed = [loss, *parts.values()]
                        read = loss
                        self.facts.loss_harmed = tracer.origin_of(harmed) is not None
                        if not self.facts.loss_harmed:  # a finite loss: the harm is in the gradients
                            d.backward(loss)
                            named = [(n, local(p.grad)) for n, p in d.model.named_parameters() if p.grad is not None]
                            harmed = [g for _, g in named]
                        elif self.sharded:  # every rank's backward takes part in FSDP's reduce-scatters
                            d.backward(loss)
                except Exception as e:  # the same exception as in the run, usually
                    if is_out_of_memory(e) or isinstance(e, NotReplayable):
                        raise
                    exc = e
                origin = tracer.origin_of(harmed)
                if origin is None and exc is None:  # (finite: kept to tell a transient fault, see pinpoint)
                    self.finite_values = [t.detach().clone() for t in [read, *harmed]
                                          if isinstance(t, torch.Tensor)]
                self.facts.consequence = tracer.consequence
                if origin is not None:
                    self.facts.unharmed_buffers = tracer.lineage.unharmed_writers(
                        [(n, local(b)) for n, b in d.model.named_buffers()])
                self.facts.nonfinite_outputs = list(tracer.nonfinite_outputs)
                if origin is None and exc is not None:
                    # user code raised before the harm could be computed: the earliest birth stands for it
                    origin = tracer.first
            if isinstance(read, torch.Tensor) and read.numel() == 1:
                self.facts.loss_value = float(read.detach())
            if named is not None:
                self.facts.grads_nonfinite = nonfinite_names(named)
        return tracer, origin, exc, batch

    def take_part(self, inputs: StepInputs, micro: int) -> None:
        """FSDP: this rank's micro-batch did not trip, but the tripping ranks' replay all-gathers with it: replay it
        too, as they do theirs (not where it ran under the live tracer, which they explain without a replay)."""
        if self.live is None or not self.live.covers(inputs.step, micro, False):
            self.replay(inputs, micro)

    def trace_buffer_writers(self, inputs: StepInputs, micro: int, checks: list[Check]) -> None:
        """The watch saw buffers turn non-finite in micro-batch `micro` of step `inputs.step` (no harm yet): replay
        that micro-batch's forward and loss under the tracer, from the step's snapshot, and keep the op that wrote
        each buffer (BufferWriters). Mid-step the parameters and optimizer are still the snapshot's, so only the
        buffers and the RNG are set aside and put back: the run goes on exactly as it would have."""
        d = self.driver
        new = [c for c in checks if c.name not in self.writers]
        if not new:
            return
        what = ", ".join(f"`{c.name}` ({c.nonfinite.upper()})" for c in new)
        d.log(f"  [watch] buffer {what} turned non-finite at step {inputs.step}, micro-batch {micro}, no harm yet: "
              f"replaying that forward under the op-level tracer to name the op that wrote it", "yellow")
        why = ("not replayed (no snapshot)" if inputs.snapshot is None or not inputs.snapshot.kept else
               "not replayed under torchrun (one rank replaying alone would fall out of step with the others)"
               if d.dist is not None else None)
        if why is not None:
            for c in new:
                self.writers.add(Written(c.name, inputs.step, micro, c.nonfinite, None, why))
            return
        origins, raw, rng = {}, inputs.batches[micro - 1], capture_rng(d.device)
        live = inputs.snapshot.restore_buffers()
        before = {c.name for c in new if has_nonfinite(d.model.get_buffer(c.name))}  # as the step began
        try:
            with d.watch_paused():
                for i in range(micro - 1):  # the buffers as the earlier micro-batches left them (forward only)
                    restore_rng(inputs.rng[i], d.device)
                    d.replay_loss(self._batch(inputs, i), inputs.tape(i))
                restore_rng(inputs.rng[micro - 1], d.device)
                batch = self._batch(inputs, micro - 1)
                with Tracer(d.model, poisoned=self.writers.names) as tracer:
                    for path, t in flat_tensors(batch):
                        tracer.mark(t, path, "data")
                    try:
                        d.replay_loss(batch, inputs.tape(micro - 1))
                    except Exception as exc:  # the run's own micro-batch raised nothing
                        if is_out_of_memory(exc):
                            raise
                    origins = {c.name: tracer.origin_of(d.model.get_buffer(c.name)) for c in new}
        finally:
            inputs.snapshot.put_back_buffers(live)
            restore_rng(rng, d.device)
        self.facts.consequence = None  # (a buffer's writer is its own origin: nothing of an earlier replay's)
        for c in new:
            event = origins.get(c.name)
            if event is None or c.name in before:
                why = (f"not traced: it was non-finite already when step {inputs.step} began, so it was written "
                       f"outside a forward and loss (an optimizer hook, an update after the optimizer step, a load), "
                       f"which no replay runs" if c.name in before else
                       "not traced: the replay of that forward left it finite (state the replay does not restore)")
                self.writers.add(Written(c.name, inputs.step, micro, c.nonfinite, None, why))
                continue
            finding = (data_finding(inputs.step, micro, raw, Check(CheckKind.DATA, event.label, 1.0))
                       if event.phase == Phase.DATA else self.event_finding(inputs.step, micro, event, raw, None, None))
            self.writers.add(Written(c.name, inputs.step, micro, c.nonfinite, finding))
            d.log(f"  [pinpoint] buffer `{c.name}` was written by {finding.op or finding.watch} ({finding.phase}"
                  f"{f', module `{finding.module}`' if finding.module else ''}"
                  f"{f', {finding.source}' if finding.source else ''}): {finding.cause}; kept as the origin should "
                  f"harm descend from it later", "yellow")

    def finite_without_scaling(self, inputs: StepInputs, micro: int) -> bool:
        """fp16: do micro-batches 1..micro give finite gradients with the loss scale off? (Then a non-finite
        scaled gradient was only the scale's overflow.) Leaves the state as the snapshot had it."""
        d = self.driver
        try:
            with d.watch_paused():
                self._rerun(inputs, micro, scaled=False)
                grads = [p.grad.detach() for p in d.model.parameters() if p.grad is not None]
                return bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()) if grads else True
        except Exception as exc:  # anything odd here is for the op-level replay to explain
            if is_out_of_memory(exc):
                raise
            return False
        finally:
            inputs.snapshot.restore()

    # -- findings -----------------------------------------------------------------------------------------------
    def pinpoint(self, trip: Trip, trace: bool = True) -> Finding | None:
        """The Finding behind a trip (Trip: a micro-batch, or with trip.optimizer the step's optimizer update).
        Raises TaskFailure when user code raised and no non-finite value came before it. trace=False (DDP, not
        the pinpointing rank): only take part in the re-run's gradient averaging, and return None."""
        inputs, micro, check, error, optimizer = trip.inputs, trip.micro, trip.check, trip.error, trip.optimizer
        if not trace:
            self.replay(inputs, micro, optimizer, trace=False)
            return None
        log = self.driver.log
        raw = trip.batch
        log(f"  [watch] TRIP at step {inputs.step}, micro-batch {micro}: {trip.seen()}", "red")
        if check is not None and check.kind == CheckKind.DATA:
            return data_finding(inputs.step, micro, raw, check)
        live, self.live = self.live, None
        try:
            if live is not None and live.covers(inputs.step, micro, optimizer):
                log(f"  [pinpoint] step {inputs.step} micro-batch {micro} ran under the op-level tracer (--trace-at): "
                    f"its trace is explained, no replay")
                self.facts = ReplayFacts()
                tracer, event, replay_exc = live.tracer, live.origin(self.facts, error), None
            else:
                log(f"  [pinpoint] replaying step {inputs.step} micro-batch {micro} from the snapshot under the "
                    f"op-level tracer (forward, loss, backward{', optimizer' if optimizer else ''})...")
                tracer, event, replay_exc, _ = self.replay(inputs, micro, optimizer)
        except NotReplayable as why:
            return not_replayable_finding(self.driver, inputs, micro, check, error, why)
        except Exception as exc:  # only an out-of-memory error is answered here
            if not is_out_of_memory(exc):
                raise
            return out_of_memory_finding(self.driver, inputs, micro, check, error, exc)
        error = error or replay_exc
        log(f"  [pinpoint] {tracer.ops_seen} ops traced, {len(tracer.origins)} non-finite origin(s); the earliest "
            f"in the lineage of the harmed value is the finding.")
        transient = None
        if event is None and error is None and not optimizer and check is not None and not self.sharded \
                and (live is None or not live.covers(inputs.step, micro, optimizer)):
            tracer, event, transient = replay_again(self, inputs, micro)
        if event is None:
            if error is not None:
                raise TaskFailure(f"step {inputs.step}, micro-batch {micro}: {describe_exception(error)}. The replay "
                                  f"found no NaN/Inf before it, so this is an error in the training code, not a "
                                  f"numerical one.")
            why = None
            if optimizer and check is not None:  # the update, replayed exactly, made nothing non-finite
                why = (f"the optimizer step of step {inputs.step}, replayed from the state before it, left every "
                       f"parameter and optimizer state finite: `{check.name}` was made non-finite after it and "
                       f"before step {inputs.step + 1} began, by code outside the optimizer step (an EMA, a weight "
                       f"clamp or renormalisation, a callback or hook), which no replay runs. Look at what the loop "
                       f"does to the weights between optimizer.step() and the next forward.")
            if transient is not None:
                return transient_finding(self.driver, inputs.step, micro, raw, check, transient)
            return watch_only_finding(inputs.step, micro, raw, check, self.driver.model, why)
        watch = check.said() if check is not None else None
        if (writer := self.writers.finding_for(event.label, inputs.step, micro, watch)) is not None:
            return writer  # a buffer written non-finite in an earlier micro-batch: its writer is the origin
        if inputs.step == self.driver.first_step + 1 and is_start_state(event):
            # nothing in this run came before: the checkpoint (or the task's initialisation) holds the value
            return start_state_finding(inputs.step, micro, event, raw, watch, self.driver.model,
                                       self.driver.checkpoint)
        if event.phase == Phase.DATA:  # the batch itself held the value that reached the harm
            return data_finding(inputs.step, micro, raw, Check(CheckKind.DATA, event.label, float(event.kind)))
        reached = None
        if event.phase == Phase.OPTIMIZER:
            named = dict(param_and_state_tensors(self.driver.model.named_parameters(), self.driver.optimizer))
            reached = tracer.reached(event, named)
        return self.event_finding(inputs.step, micro, event, raw, check, error, reached)

    def pinpoint_eval(self, step: int, index: int, raw, rng: dict, evaluate, check: Check | None,
                      error: BaseException | None, where: str | None = None) -> Finding:
        """The finding behind a non-finite value of the eval pass after step `step`, on held-out batch `index`
        (1-based; the finding's micro_step). `evaluate(batch)` runs the task's eval function (no_grad inside) and
        returns the values that count as harm; the caller has the model in eval mode. The batch is replayed with
        its RNG state under the tracer, its tensors marked as data origins, the tracer's module hooks registered
        globally so that torch's inference fast paths run as they did in the pass -> a Finding in phase "eval".
        `where` opens its explanation (default: the eval pass's words)."""
        d = self.driver
        d.log(f"  [pinpoint] replaying {'that forward as it ran' if where else f'held-out batch {index} in eval mode'} "
              f"under the op-level tracer...")
        restore_rng(rng, d.device)
        batch = move_to(raw, d.device, copy=True)
        tracer, harmed, exc = Tracer(d.model, poisoned=self.writers.names), [], None
        tracer.context.global_hooks = True  # a module with a forward hook of its own turns the fast paths off
        with tracer:
            for path, t in flat_tensors(batch):
                tracer.mark(t, path, "data")
            try:
                harmed = [t for _, t in evaluate(batch)]
            except Exception as e:  # the same exception as in the pass, usually
                if is_out_of_memory(e):
                    raise
                exc = e
            origin = tracer.origin_of(harmed) or (tracer.first if exc is not None else None)
            self.facts.consequence = tracer.consequence if origin is not None else None
        error = error or exc
        d.log(f"  [pinpoint] {tracer.ops_seen} ops traced, {len(tracer.origins)} non-finite origin(s).")
        where = where or f"In the eval pass after step {step} (model.eval(), no_grad), on held-out batch {index}: "
        seen = check.said() if check is not None else None
        if origin is not None and (writer := self.writers.finding_for(origin.label, step, 0, seen)) is not None:
            return writer  # the pass met a buffer that a training step wrote non-finite: that step's op
        if origin is None:
            if error is not None or check is None:
                raise TaskFailure(f"eval pass after step {step}, held-out batch {index}: "
                                  f"{describe_exception(error) if error else 'no value to check'}. The replay found "
                                  f"no NaN/Inf before it, so this is an error in the training code, not a numerical "
                                  f"one.")
            finding = watch_only_finding(step, index, raw, check, d.model)
        elif origin.phase == Phase.DATA:
            finding = data_finding(step, index, raw, Check(CheckKind.DATA, origin.label, float(origin.kind)))
        else:
            finding = self.event_finding(step, index, origin, raw, check, error, after=True)
        return replace(finding, phase=Phase.EVAL, explanation=where + finding.explanation)

    def event_finding(self, step: int, micro: int, event: OpEvent, raw, check: Check | None,
                      error: BaseException | None, reached: list[str] | None = None, after: bool = False) -> Finding:
        """The replay's Trace of `event`, explained (engine/explain/explain.py). `after`: the micro-batch ran after
        step `step`'s update (the eval pass), not within it."""
        d = self.driver
        advice = AdviceContext(updates=step - d.first_step - (0 if after else 1), checkpoint=d.checkpoint,
                               clipping=clipping_of(d), dataset_indices=dataset_indices(raw))
        trace = Trace(step, micro, event, raw, check, error, self.facts, reached, advice)
        return explain(trace, d.model, d.optimizer)
