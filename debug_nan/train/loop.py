"""The runner's training loop: one loop for every task, readable top to bottom.

for each optimizer step:
    snapshot the state (for a replay), then for each micro-batch:
        capture the batch, forward + loss, backward (loss / accumulation), watch batch, loss and gradients
        one host sync: did anything go non-finite? -> pinpoint it (replay under the tracer), stop
    clip, optimizer step, schedule, watch the parameters (checked at the next sync)

Elsewhere: the fp16 policy (precision.py), the DDP agreement (agreement.py), the task's recipe (recipe.py), the
log lines (report/step_line.py). The Trainer is the pinpointer's StepDriver."""

from __future__ import annotations

import sys
import time
import warnings
from contextlib import nullcontext
from dataclasses import replace

import torch
from tqdm import tqdm

from debug_nan.checks.driver import StepInputs, TaskFailure, is_out_of_memory
from debug_nan.checks.finding import Finding, explosion_finding
from debug_nan.checks.history import History, StepRecord
from debug_nan.checks.pinpoint import Pinpointer
from debug_nan.checks.snapshot import Snapshot, capture_rng
from debug_nan.checks.stats import capture_batch, move_to
from debug_nan.checks.watch import Watch
from debug_nan.errors import InputError
from debug_nan.settings import RunSettings
from debug_nan.train.agreement import RankAgreement, RunAborted
from debug_nan.train.checkpoint import resume, skip_batches
from debug_nan.train.device import resolve_device
from debug_nan.train.evaluate import EvalPass
from debug_nan.train.distributed import DistContext, agree_on_setup, average_gradients, wrap_ddp
from debug_nan.train.overlap import OverlappedAllReduce
from debug_nan.train.outcome import MicroOutcome, RunResult, SilentSteps, StepObserver
from debug_nan.train.precision import Precision
from debug_nan.train.recipe import build_recipe, enter_training_mode
from debug_nan.train.repro import repro_state
from debug_nan.train.unreplayed import InterruptedPinpoint, interrupted_pinpoint, unreplayed_finding
from debug_nan.train.task import Task, eager_module, micro_batches, split_loss


class Trainer:
    def __init__(self, task: Task, settings: RunSettings, log, device: torch.device | None = None,
                 dist_ctx: DistContext | None = None, observer: StepObserver | None = None):
        self.task, self.log, self.dist = task, log, dist_ctx
        self.observer = observer or SilentSteps()
        self.device = device or resolve_device(settings.device, log)
        torch.manual_seed(settings.seed)
        model, compiled = eager_module(task.model)
        if compiled:
            log("NOTICE: the task's model is torch.compile'd; debugging the eager module underneath (the same "
                "parameters), which the checks can hook and replay op by op. loss() receives that module.")
        self.model = model.to(self.device)  # the checks, snapshots and replays work on the bare module
        frozen = enter_training_mode(self.model)
        if frozen:
            log(f"NOTICE: kept in eval mode, as the task left them: {', '.join(p or '<model>' for p in frozen)}.")
        self.recipe = build_recipe(task, settings, [p for p in self.model.parameters() if p.requires_grad], log)
        self.optimizer, self.scheduler = self.recipe.optimizer, self.recipe.scheduler
        self.s = replace(settings, max_grad_norm=self.recipe.max_grad_norm)  # the settings as this run uses them
        self.precision = Precision(settings.precision, self.device)
        self.scaler = self.precision.scaler
        self.accumulation_steps = settings.gradient_accumulation_steps
        self.watch = Watch(self.model, self.optimizer)
        self.watch.detailed = settings.trace_every_step
        # DDP: the gradients are averaged during the last micro-batch's backward, by collectives every rank reaches
        self.reducer = OverlappedAllReduce([p for _, p in self.watch.named_params], dist_ctx) \
            if dist_ctx is not None else None
        # one snapshot: step k + 1 saves into it only once its first sync found step k's update finite (stage())
        self.snapshot = Snapshot(self.model, self.optimizer, self.scaler, self.scheduler, settings.snapshot)
        log(f"  snapshot {self.snapshot.describe()}")
        self.pinpointer = Pinpointer(self)
        # --checkpoint: the optimizer steps it had made (0: a fresh start); the run's step numbers continue from it
        self.first_step = resume(settings, self.model, self.optimizer, self.scheduler, self.scaler, task, log)
        self.evaluation = EvalPass(self) if settings.eval_every else None
        self.history = History()
        self.save_repro = None  # set by the runner: writes a repro bundle from repro_state(), returns its path
        self.wrapped, self.agreement = self.model, None  # what the training step calls: DDP under torchrun
        if dist_ctx is not None:  # the first collective, once every rank got this far (a rank that raised above
            agree_on_setup(dist_ctx, self.device, None)  # makes the runner call the same agreement: all raise)
            self.wrapped = wrap_ddp(self.model, self.device)
            self.agreement = RankAgreement(dist_ctx, self.device, log)
            torch.manual_seed(settings.seed + dist_ctx.rank)  # per-rank dropout streams; weights came from rank 0
        self.agree_codes = self.agreement.agree_codes if self.agreement is not None else None  # for watch.sync

    # -- the pieces of a step, shared by the run and the replay (the StepDriver methods) -------------------------
    def compute_loss(self, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The task's loss (in autocast) on the module the run trains (DDP under torchrun)."""
        with self.precision.autocast():
            return split_loss(self.task.loss(self.wrapped, batch))

    def replay_loss(self, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        with self.precision.autocast():  # the same on the bare module: no DDP collectives, one rank replays alone
            return split_loss(self.task.loss(self.model, batch))

    def backward(self, loss: torch.Tensor, scaled: bool = True) -> None:
        scaled_loss = loss / self.accumulation_steps
        (self.precision.scale(scaled_loss) if scaled else scaled_loss).backward()

    def optimizer_step(self) -> None:
        """From accumulated (scaled) gradients, as at the end of a step: unscale, clip, step, schedule."""
        self.precision.unscale(self.optimizer)
        self.clip_and_step(None)

    def average_gradients(self) -> None:
        if self.dist is not None:
            average_gradients(self.watch.named_params, self.dist)

    def watch_paused(self):
        return self.watch.paused()

    def clip_and_step(self, grad_norms: list[torch.Tensor] | None) -> None:
        """Clip with the norms the watch already computed (no second pass), then step (the scaler may skip)."""
        grads = [p.grad for _, p in self.watch.named_params if p.grad is not None]
        clip = self.recipe.max_grad_norm
        if clip and grads:
            norms = grad_norms if grad_norms else torch._foreach_norm(grads)
            total = torch.linalg.vector_norm(torch.stack([n.to(self.device) for n in norms]))
            torch._foreach_mul_(grads, torch.clamp(clip / (total + 1e-6), max=1.0).to(grads[0].device))
        # the optimizer is stepped here, in the loop: the tracer shows an origin in it at torch's own line
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.step_schedule()

    def step_schedule(self) -> None:
        if self.scheduler is None:
            return
        with warnings.catch_warnings():  # a step the fp16 scaler skipped still advances the schedule
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()

    # -- the loop -----------------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        result = RunResult(status="clean", steps_run=0, history=self.history, recipe=self.recipe.describe())
        stream = skip_batches(micro_batches(self.task, self.dist), self.s.skip_batches, self.log)
        previous: StepInputs | None = None
        # progress on stderr only when it is a terminal: under `2>&1 | tee` the log stays clean
        bar = tqdm(total=self.s.max_steps, desc="debug-nan", unit="step", file=sys.stderr, leave=False,
                   disable=not sys.stderr.isatty())
        try:
            for step in range(self.first_step + 1, self.first_step + self.s.max_steps + 1):
                finding, inputs = self.train_step(step, stream, previous)
                result.steps_run = step - self.first_step
                bar.update(1)
                if finding is None and self.evaluation is not None and self.evaluation.due(step):
                    # this update's parameter check first: an eval pass on weights it broke is not the origin
                    finding = self.check_last_update(inputs)
                    if finding is not None:
                        previous = None  # the update to undo is this step's own: undo_update restores `inputs`
                    elif (evaluated := self.evaluation.run(step)) is not None:
                        result.findings.append(evaluated)
                        if not self.s.keep_going:
                            break  # (under --keep-going training goes on: the pass changed nothing to undo)
                if finding is None:
                    previous = inputs
                    continue
                result.findings.append(finding)
                if not self.s.keep_going:
                    break
                self.undo_update(finding, inputs, previous)
                previous = None
            else:  # the parameter check of the last step: one more sync (and agreement under DDP)
                finding = self.check_last_update(previous)
                if finding is not None:
                    result.findings.append(finding)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (report/interrupts.py raises KeyboardInterrupt)
            result.interrupted = True
            if isinstance(exc, InterruptedPinpoint):  # the trip the watch saw stands, without the op
                result.findings.append(exc.finding)
            self.log(f"Interrupted ({exc.args[0] if exc.args else 'Ctrl-C'}): writing the partial summary.", "yellow")
        except TaskFailure as failure:
            result.error = str(failure)
        except RunAborted as abort:
            result.error, result.exit_code = str(abort), abort.exit_code
            result.interrupted = abort.exit_code in (130, 143)
        finally:
            bar.close()
        result.finding = result.findings[0] if result.findings else None
        # non-finite module outputs / batch tensors that are not findings by themselves (masks, nanmean inputs)
        result.notes.extend(self.history.nonfinite_notes())
        if result.finding is not None:
            result.status = "nonfinite"
        elif result.error is not None:
            result.status = "error"
        return result

    def check_last_update(self, last: StepInputs | None) -> Finding | None:
        """The parameter check of the last optimizer step, read now (normally at the next step's first sync)."""
        final = self.watch.sync(self.agree_codes)
        return self.decide(MicroOutcome(last, self.accumulation_steps, final.first_harm(),
                                        rank_codes=final.rank_codes, previous=last))

    def train_step(self, step: int, stream, previous: StepInputs | None) -> tuple[Finding | None, StepInputs]:
        """One optimizer step with every check: snapshot, micro-batches, explosion check, clip, step."""
        started = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        inputs = StepInputs(step=step, batches=[], rng=[], snapshot=self.snapshot)
        inputs.snapshot.stage()  # the buffers as the forward finds them; save() after the first sync
        record = self.history.begin(step)
        record.lr = self.optimizer.param_groups[0]["lr"]
        self.observer.begin_step(step)
        self.optimizer.zero_grad(set_to_none=True)
        grad_norms = None
        for micro in range(1, self.accumulation_steps + 1):
            outcome = self.micro_step(inputs, micro, stream, record, previous)
            if micro == 1 and not outcome.blames_last_update:  # step - 1 is not replayed: its copy can go
                inputs.snapshot.save()
            finding = self.decide(outcome)
            if finding is not None:
                return finding, inputs
            if record.scaler_skipped:
                break
            grad_norms = outcome.grad_norms
        record.finish()
        if record.scaler_skipped:
            self.optimizer.zero_grad(set_to_none=True)
            self.log(self.precision.skip_step())
            self.step_schedule()
        else:
            if self.agreement is not None:  # averaged already, during the backward: their global norms
                grad_norms = self.agreement.gradient_norms(self.watch.named_params, record)
            finding = self.check_explosion(record)
            if finding is not None:
                return finding, inputs
            self.clip_and_step(grad_norms)
            self.watch.watch_params()
        record.seconds = time.perf_counter() - started
        if self.device.type == "cuda":
            record.peak_memory_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
        self.observer.end_step(record)
        return None, inputs

    def micro_step(self, inputs: StepInputs, micro: int, stream, record: StepRecord,
                   previous: StepInputs | None) -> MicroOutcome:
        """Fetch, forward, loss, backward and the watch for one micro-batch, then its one host sync.

        Under DDP a reason to stop that is not numerical (bad input, out of memory, Ctrl-C) on one rank is
        carried through the same agreement as a trip, so that no rank is left waiting in a collective."""
        outcome = MicroOutcome(inputs, micro, record=record, previous=previous)
        last = micro == self.accumulation_steps
        # DDP's own reducer stays idle (no_sync): on the last micro-batch train/overlap.py averages the gradients
        reducer = self.reducer if last else None
        no_sync = self.wrapped.no_sync() if self.dist is not None else nullcontext()
        if reducer is not None:
            reducer.arm()  # before anything can raise: finish() below then issues this step's all-reduces
        try:
            batch = self.next_batch(stream, inputs, micro)
            with no_sync:
                self.watch.watch_batch(batch)
                loss, parts = self.compute_loss(batch)
                self.watch.watch_loss(loss, parts)
                self.backward(loss)
            if last and reducer is None:
                self.precision.unscale(self.optimizer)
            # this rank's own gradients (under DDP not yet averaged): the trip says which rank saw a NaN first
            outcome.grad_norms = self.watch.watch_grads()
        except (InputError, KeyboardInterrupt) as exc:
            if self.dist is None:
                raise
            outcome.abort = exc
        except Exception as exc:  # user code raising mid-step (e.g. a loss that raises on NaN) is a trip
            if is_out_of_memory(exc) and self.dist is None:
                raise
            outcome.abort, outcome.error = (exc, None) if is_out_of_memory(exc) else (None, exc)
        if reducer is not None:  # every rank, whatever happened above: the step's all-reduces, then the fp16 unscale
            if (warning := reducer.finish()) is not None:
                self.log(warning, "yellow")
            if outcome.error is None and outcome.abort is None:
                self.precision.unscale(self.optimizer)
        result = self.watch.sync(self.agree_codes, raised=outcome.error is not None, abort=outcome.abort is not None)
        if outcome.abort is None:
            self.history.add_micro(record, result, last, self.precision.loss_scale() if micro == 1 else None)
        self.observer.layer_trace(micro, result.layer_stats)
        outcome.check, outcome.rank_codes = result.first_harm(), result.rank_codes
        return outcome

    def next_batch(self, stream, inputs: StepInputs, micro: int):
        """The next micro-batch on the device. What the replay keeps is captured first, before any user code
        (describe_batch, loss) can change it in place."""
        raw = next(stream)
        inputs.batches.append(capture_batch(raw, self.device))
        inputs.rng.append(capture_rng(self.device))
        batch = move_to(raw, self.device)
        if self.task.describe_batch is not None:
            self.observer.batch_notes(micro, self.task.describe_batch(raw))
        return batch

    # -- trips ----------------------------------------------------------------------------------------------------
    def decide(self, o: MicroOutcome) -> Finding | None:
        """Trip or not, from one micro-batch's checks (under DDP: the same decision on every rank)."""
        if self.agreement is not None:
            genuine = self.gradient_trip_is_genuine if self.scaler is not None else None
            return self.agreement.decide(o, self.pinpoint, genuine, self.skip_overflow)
        if o.check is None and o.error is None:
            return None
        if o.only_gradients and o.record is not None and self.gradients_finite_without_scale(o):
            self.skip_overflow(o)
            return None
        return self.pinpoint(o)

    def gradients_finite_without_scale(self, o: MicroOutcome) -> bool:
        """fp16: the gradients are finite when the same micro-batches run without the loss scale. With
        --snapshot off nothing can be re-run: the trip counts as the scaler's overflow, as GradScaler takes it."""
        if not o.inputs.snapshot.kept:
            return True
        return self.precision.may_overflow() and self.pinpointer.finite_without_scaling(o.inputs, o.micro)

    def gradient_trip_is_genuine(self, o: MicroOutcome) -> bool:
        return not self.gradients_finite_without_scale(o)

    def skip_overflow(self, o: MicroOutcome) -> None:
        o.record.scaler_skipped = True

    def pinpoint(self, o: MicroOutcome, trace: bool = True) -> Finding | None:
        """The finding behind a trip; a parameter trip is the previous step's optimizer update. The finding's
        repro bundle is written here, by the rank that pinpointed."""
        kind = o.check.kind if o.check is not None else None
        if (not self.snapshot.kept and kind != "data") or (kind == "param" and not self.snapshot.keeps_optimizer):
            return unreplayed_finding(o, self.accumulation_steps, self.model, self.log, self.snapshot.kept)
        if o.check is not None and o.check.kind == "param":
            if o.previous is None:
                return None
            inputs, micro, optimizer = o.previous, self.accumulation_steps, True
            finding = self.pinpointer.pinpoint(inputs, micro, o.check, None, optimizer=True, trace=trace)
        else:
            inputs, micro, optimizer = o.inputs, o.micro, False
            try:
                finding = self.pinpointer.pinpoint(inputs, micro, o.check, o.error)
            except KeyboardInterrupt as exc:
                if o.check is None:
                    raise
                raise interrupted_pinpoint(exc, inputs, micro, o.check, self.model) from None
        if finding is not None and self.save_repro is not None:
            try:
                finding.bundle = self.save_repro(repro_state(self, inputs, micro, finding, o.check, optimizer))
                self.log(f"  [bundle] repro bundle written: {finding.bundle} (debug-nan replay {finding.bundle})")
            except Exception as exc:  # noqa: BLE001 - the finding matters more than its bundle
                self.log(f"  [bundle] could not write the repro bundle: {type(exc).__name__}: {exc}", "yellow")
        return finding

    def check_explosion(self, record: StepRecord) -> Finding | None:
        if (hit := self.history.explosion(self.s.explosion_threshold, self.s.explosion_growth)) is None:
            return None
        self.log(f"  [watch] TRIP at step {record.step}: gradient norm {record.grad_norm:.4g} (explosion)", "red")
        return explosion_finding(record, hit[1], self.history.steps, self.accumulation_steps,
                                 self.s.explosion_threshold, self.model)

    def undo_update(self, finding: Finding, inputs: StepInputs, previous: StepInputs | None) -> None:
        """--keep-going: skip the failing step's update (an optimizer-phase finding is the previous step's)."""
        self.log("--keep-going: skipping this step's update and going on.", "yellow")
        bad_update = finding.phase == "optimizer" and previous is not None
        (previous if bad_update else inputs).snapshot.restore()
        self.optimizer.zero_grad(set_to_none=True)
