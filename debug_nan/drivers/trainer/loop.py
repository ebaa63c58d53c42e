"""The runner's training loop: one loop for every task, readable top to bottom.

for each optimizer step:
    session.begin_step, then for each micro-batch:
        session.begin_micro(batch), forward + loss, backward (loss / accumulation)
        session.end_micro: the one host sync; session.decide: trip? -> the finding (pinpointed), stop
    clip, optimizer step (or the fp16 scaler's skip), schedule, session.stepped (parameters read at the next sync)

The protocol of a step (watch, sync, trip decision, fp16 probe, explosion check, pinpoint, bundle) is the step
session's (session.py), shared with the API's Monitor and the framework callbacks. Here: the task's own step, its
data stream, the DDP reducer, --keep-going and the eval pass. The Trainer is the pinpointer's StepDriver."""

from __future__ import annotations

import sys
import time
import warnings
from contextlib import nullcontext
from dataclasses import replace

import torch
from tqdm import tqdm

from debug_nan.drivers.recipe import build_recipe, enter_training_mode
from debug_nan.drivers.session_driver import SessionDriver
from debug_nan.drivers.task import Task, micro_batches, split_loss
from debug_nan.drivers.trainer.checkpoint import resume, skip_batches
from debug_nan.drivers.trainer.device import resolve_device
from debug_nan.drivers.trainer.evaluate import EvalPass
from debug_nan.drivers.trainer.overlap import OverlappedAllReduce
from debug_nan.drivers.trainer.sharding import shard_model
from debug_nan.drivers.wrappers import unwrapped
from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.replay.driver import TaskFailure, is_out_of_memory
from debug_nan.engine.session.agreement import RankAgreement, RunAborted
from debug_nan.engine.session.distributed import DistContext, agree_on_setup, wrap_ddp
from debug_nan.engine.session.outcome import MicroOutcome, SilentSteps, StepObserver
from debug_nan.engine.session.result import RunResult
from debug_nan.engine.session.precision import Precision, scaled_step
from debug_nan.engine.sharded import locals_of
from debug_nan.engine.session.unreplayed import InterruptedPinpoint
from debug_nan.engine.stats import move_to
from debug_nan.engine.watch.watch import Watch
from debug_nan.errors import InputError
from debug_nan.settings import RunSettings


class Trainer(SessionDriver):
    dialect = "cli"  # the advice names debug-nan's options (--max-grad-norm, ...)

    def __init__(self, task: Task, settings: RunSettings, log, device: torch.device | None = None,
                 dist_ctx: DistContext | None = None, observer: StepObserver | None = None):
        """`settings`: a RunSettings, or the CLI's JobSettings (the same components and the built-in task's);
        the Trainer reads its training and watch settings."""
        self.task, self.log, self.dist = task, log, dist_ctx
        self.observer = observer or SilentSteps()
        train = settings.train
        self.device = device or resolve_device(train.device, log)
        torch.manual_seed(train.seed)
        # the checks hook every submodule and replay op by op, which a compiled graph does not allow: a compiled
        # model is debugged through the eager module it wraps (the same parameters)
        model, compiled = unwrapped(task.model)
        if compiled:
            log("NOTICE: the task's model is torch.compile'd; debugging the eager module underneath (the same "
                "parameters), which the checks can hook and replay op by op. loss() receives that module.")
        self.model = model.to(self.device)  # the checks, snapshots and replays work on the bare module
        frozen = enter_training_mode(self.model)
        if frozen:
            log(f"NOTICE: kept in eval mode, as the task left them: {', '.join(p or '<model>' for p in frozen)}.")
        self.sharded = bool(train.fsdp and dist_ctx is not None)  # --fsdp: FSDP2 instead of DDP (sharding.py)
        if self.sharded:  # before the optimizer, which holds the sharded parameters; a rank that failed to build its
            agree_on_setup(dist_ctx, self.device, None)  # task stops every rank here (the broadcast is a collective)
            units = shard_model(self.model, self.device)
            log(f"  fsdp: the model sharded with FSDP2 over {dist_ctx.world} ranks ({units} units: each block of a "
                f"ModuleList, and the root); each rank watches and copies its own shards")
        self.recipe = build_recipe(task, train, [p for p in self.model.parameters() if p.requires_grad], log)
        self.optimizer, self.scheduler = self.recipe.optimizer, self.recipe.scheduler
        # the settings as this run uses them (the task's own clipping included)
        self.s = replace(settings, train=replace(train, max_grad_norm=self.recipe.max_grad_norm))
        self.precision = Precision(train.precision, self.device)
        self.accumulation_steps = train.gradient_accumulation_steps
        watch = Watch(self.model, self.optimizer)
        watch.exact_grad_norms = bool(self.recipe.max_grad_norm)  # clip_and_step reuses them
        watch.detailed = settings.watch.trace_every_step
        # DDP: the gradients are averaged during the last micro-batch's backward, by collectives every rank reaches
        self.reducer = OverlappedAllReduce([p for _, p in watch.named_params], dist_ctx) \
            if dist_ctx is not None and not self.sharded else None  # (FSDP reduce-scatters in the backward)
        self.agreement = RankAgreement(dist_ctx, self.device, log) if dist_ctx is not None else None
        self.open_session(settings.watch, scaler=self.precision.scaler, watch=watch, agreement=self.agreement,
                          agree_on_errors=True, averaged_after_watch=dist_ctx is not None and not self.sharded,
                          scheduler=self.scheduler)
        self.snapshot = self.session.snapshot
        log(f"  snapshot {self.snapshot.describe()}")
        # --checkpoint: the optimizer steps it had made (0: a fresh start); the run's step numbers continue from it
        self.first_step = resume(train, self.model, self.optimizer, self.scheduler, self.scaler, task, log,
                                 self.sharded)
        self.evaluation = EvalPass(self) if train.eval_every else None
        self.wrapped = self.model  # what the training step calls: DDP under torchrun
        if dist_ctx is not None:  # the first collective, once every rank got this far (a rank that raised above
            agree_on_setup(dist_ctx, self.device, None)  # makes the runner call the same agreement: all raise)
            self.wrapped = self.model if self.sharded else wrap_ddp(self.model, self.device)
            torch.manual_seed(train.seed + dist_ctx.rank)  # per-rank dropout streams; weights came from rank 0

    @property
    def checkpoint(self) -> str | None:
        """(StepDriver) --checkpoint: where the run's state came from."""
        return self.s.train.checkpoint

    @property
    def save_repro(self):
        """Set by the runner: writes a repro bundle from repro_state(), returns its path (the session's sink)."""
        return self.session.p.bundle_sink

    @save_repro.setter
    def save_repro(self, sink) -> None:
        self.session.p.bundle_sink = sink

    # -- the pieces of a step, shared by the run and the replay (the StepDriver methods) -------------------------
    def compute_loss(self, batch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The task's loss (in autocast) on the module the run trains (DDP under torchrun)."""
        with self.precision.autocast():
            return split_loss(self.task.loss(self.wrapped, batch))

    def replay_loss(self, batch, tape=None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        with self.precision.autocast():  # the same on the bare module: no DDP collectives, one rank replays alone
            return split_loss(self.task.loss(self.model, batch))

    def optimizer_step(self, tape=None) -> None:
        """From accumulated (scaled) gradients, as at the end of a step: unscale, clip, step, schedule."""
        self.clip_and_step(None)

    def average_gradients(self) -> None:
        if not self.sharded:  # (FSDP reduce-scattered them in the replayed backward)
            super().average_gradients()

    def clip_and_step(self, grad_norms: list[torch.Tensor] | None) -> None:
        """Clip with the norms the watch already computed (no second pass), then step (the scaler may skip)."""
        # the optimizer is stepped here, in the loop: the tracer shows an origin in it at torch's own line
        scaled_step(self.optimizer, self.scaler, lambda: self.clip_gradients(grad_norms))
        self.step_schedule()

    def clip_gradients(self, grad_norms: list[torch.Tensor] | None = None) -> None:
        """The recipe's clipping of the true gradients, by their total norm (from `grad_norms` where the watch
        computed them: exact_grad_norms)."""
        grads = [p.grad for _, p in self.watch.named_params if p.grad is not None]
        grads = locals_of(grads) if self.sharded else grads  # (the watch's norms are the global ones)
        clip = self.recipe.max_grad_norm
        if clip and grads:
            norms = grad_norms if grad_norms else torch._foreach_norm(grads)
            total = torch.linalg.vector_norm(torch.stack([n.to(self.device) for n in norms]))
            torch._foreach_mul_(grads, torch.clamp(clip / (total + 1e-6), max=1.0).to(grads[0].device))

    def step_schedule(self) -> None:
        if self.scheduler is None:
            return
        with warnings.catch_warnings():  # a step the fp16 scaler skipped still advances the schedule
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()

    # -- the loop -----------------------------------------------------------------------------------------------
    def run(self) -> RunResult:
        result = RunResult(status="clean", steps_run=0, history=self.history, recipe=self.recipe.describe())
        stream = skip_batches(micro_batches(self.task, self.dist), self.s.train.skip_batches, self.log)
        # progress on stderr only when it is a terminal: under `2>&1 | tee` the log stays clean
        bar = tqdm(total=self.s.train.max_steps, desc="debug-nan", unit="step", file=sys.stderr, leave=False,
                   disable=not sys.stderr.isatty())
        try:
            for step in range(self.first_step + 1, self.first_step + self.s.train.max_steps + 1):
                finding = self.train_step(step, stream)
                result.steps_run = step - self.first_step
                bar.update(1)
                if finding is None and self.evaluation is not None and self.evaluation.due(step):
                    # this update's parameter check first: an eval pass on weights it broke is not the origin
                    finding = self.session.finish()
                    if finding is None and (evaluated := self.evaluation.run(step)) is not None:
                        result.findings.append(evaluated)
                        if not self.s.watch.keep_going:
                            break  # (under --keep-going training goes on: the pass changed nothing to undo)
                if finding is None:
                    continue
                result.findings.append(finding)
                if not self.s.watch.keep_going or not self.undo_update(finding):
                    break
            else:  # the parameter check of the last step: one more sync (and agreement under DDP)
                finding = self.session.finish()
                if finding is not None:
                    result.findings.append(finding)
        except KeyboardInterrupt as exc:  # Ctrl-C, or SIGTERM (process/interrupts.py raises KeyboardInterrupt)
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
        # non-finite module outputs / batch tensors / buffers that are not findings by themselves (masks, nanmean)
        result.notes.extend(self.history.nonfinite_notes() + self.pinpointer.writers.notes())
        if result.finding is not None:
            result.status = "nonfinite"
        elif result.error is not None:
            result.status = "error"
        return result

    def train_step(self, step: int, stream) -> Finding | None:
        """One optimizer step with every check: the micro-batches, then clip and step (or the scaler's skip)."""
        started = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        session = self.session
        self.observer.begin_step(step)  # first: what the session logs as the step begins belongs under its header
        session.begin_step(step)
        record = session.record
        self.optimizer.zero_grad(set_to_none=True)
        grad_norms = None
        for micro in range(1, self.accumulation_steps + 1):
            outcome = self.micro_step(micro, stream)
            finding = session.decide(outcome)
            if finding is not None:
                return finding
            grad_norms = outcome.grad_norms
        if record.scaler_skipped:  # every micro-batch ran, as in a GradScaler loop; the update is skipped
            self.optimizer.zero_grad(set_to_none=True)
            self.log(self.precision.skip_step())
            self.step_schedule()
        else:
            self.clip_and_step(grad_norms)
            session.stepped()
        record.seconds = time.perf_counter() - started
        if self.device.type == "cuda":
            record.peak_memory_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
        self.observer.end_step(record)
        return None

    def micro_step(self, micro: int, stream) -> MicroOutcome:
        """Fetch, forward, loss, backward and the watch for one micro-batch, then its one host sync.

        Under DDP a reason to stop that is not numerical (bad input, out of memory, Ctrl-C) on one rank is
        carried through the same agreement as a trip, so that no rank is left waiting in a collective."""
        session = self.session
        last = micro == self.accumulation_steps
        error = abort = grad_norms = None
        # DDP's own reducer stays idle (no_sync): on the last micro-batch drivers/trainer/overlap.py averages the
        # gradients
        reducer = self.reducer if last else None
        no_sync = self.wrapped.no_sync() if self.dist is not None and not self.sharded else nullcontext()
        if reducer is not None:
            reducer.arm()  # before anything can raise: finish() below then issues this step's all-reduces
        try:
            batch = self.next_batch(stream, micro)
            with no_sync:
                loss, parts = self.compute_loss(batch)
                session.watch_loss(loss, parts)
                self.backward(loss)
            if last and reducer is None:
                self.precision.unscale(self.optimizer)
            # this rank's own gradients (under DDP not yet averaged): the trip says which rank saw a NaN first
            grad_norms = session.watch_grads()
        except (InputError, KeyboardInterrupt) as exc:
            if self.dist is None:
                raise
            abort = exc
        except Exception as exc:  # user code raising mid-step (e.g. a loss that raises on NaN) is a trip
            if is_out_of_memory(exc) and self.dist is None:
                raise
            abort, error = (exc, None) if is_out_of_memory(exc) else (None, exc)
        if reducer is not None:  # every rank, whatever happened above: the step's all-reduces, then the fp16 unscale
            if (warning := reducer.finish()) is not None:
                self.log(warning, "yellow")
            if error is None and abort is None:
                self.precision.unscale(self.optimizer)
        outcome = session.end_micro(last, error, abort, grad_norms)
        self.observer.layer_trace(micro, outcome.layer_stats)
        return outcome

    def next_batch(self, stream, micro: int):
        """The next micro-batch on the device. What the replay keeps is captured first (session.begin_micro),
        before any user code (describe_batch, loss) can change it in place."""
        raw = next(stream)
        batch = move_to(raw, self.device)
        self.session.begin_micro(raw, batch)
        if self.task.describe_batch is not None:
            self.observer.batch_notes(micro, self.task.describe_batch(raw))
        return batch

    def undo_update(self, finding: Finding) -> bool:
        """--keep-going: skip the failing step's update (an optimizer-phase finding is the previous step's) ->
        False when the state before it could not be rebuilt: the run stops there, as without --keep-going."""
        if not self.session.undo_update():
            self.log(f"--keep-going: stopping at step {finding.step}: the state before its update could not be "
                     f"rebuilt from the last copy, and going on from that older copy would drop the updates since "
                     f"(--snapshot-every 1 keeps a copy of every step).", "yellow")
            return False
        self.log("--keep-going: skipping this step's update and going on.", "yellow")
        self.optimizer.zero_grad(set_to_none=True)
        return True
