"""The runner: one training loop for every task, readable top to bottom.

for each optimizer step:
    snapshot the state (for a replay), then for each micro-batch:
        watch the batch, forward + loss, backward (loss / accumulation), watch the gradients
        one host sync: did anything go non-finite? -> pinpoint it (replay under the tracer), stop
    clip, optimizer step (gradient scaler for fp16), schedule, watch the parameters (checked at the next sync)
"""

from __future__ import annotations

import math
import sys
import time
import warnings
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from debug_nan.checks.history import History, StepRecord
from debug_nan.checks.pinpoint import Pinpointer, StepInputs, TaskFailure
from debug_nan.checks.snapshot import Snapshot, capture_rng
from debug_nan.checks.stats import move_to
from debug_nan.checks.watch import Watch
from debug_nan.errors import InputError, describe_exception
from debug_nan.report.finding import Finding
from debug_nan.settings import RunSettings
from debug_nan.train.distributed import DistContext, agree
from debug_nan.train.task import Task

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_device(spec: str, log) -> torch.device:
    """auto -> CUDA when available, else CPU (with a notice); cuda / cuda:N must exist."""
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        log("NOTICE: no CUDA device is available; running on the CPU (use --device cuda on a GPU node).")
        return torch.device("cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise InputError(f"--device {spec!r} is not a device: use auto, cpu, cuda or cuda:N.") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"--device {spec}: this machine has no usable CUDA device (torch "
                             f"{torch.__version__}, CUDA build: {torch.version.cuda or 'no'}). Use --device cpu or auto.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InputError(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) are visible.")
    elif device.type != "cpu":
        raise InputError(f"--device {spec}: only cpu and cuda devices are supported.")
    return device


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA's OutOfMemoryError, or the CPU allocator's RuntimeError."""
    return isinstance(exc, torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc))


def split_loss(out) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A task's loss output -> (scalar loss, other scalar entries)."""
    parts = {}
    if isinstance(out, dict):
        if "loss" not in out:
            raise TypeError(f"the task's loss returned a dict without a 'loss' entry (keys: {sorted(out)})")
        parts = {k: v for k, v in out.items() if k != "loss" and isinstance(v, torch.Tensor) and v.numel() == 1}
        out = out["loss"]
    if not isinstance(out, torch.Tensor) or out.numel() != 1:
        shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise TypeError(f"the task's loss must return a scalar tensor (got {shape})")
    return out.reshape(()), parts


@dataclass
class RunResult:
    status: str  # "clean" | "nonfinite" | "error"
    steps_run: int
    finding: Finding | None = None
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None
    history: History = field(default_factory=History)
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False
    exit_code: int | None = None  # overrides the status's code (an abort under DDP: 2 for bad input, ...)


class RunAborted(Exception):
    """Under DDP: a rank has to stop for a non-numerical reason; every rank stops with the same message."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code

    @staticmethod
    def describe(exc: BaseException | None) -> tuple[str, int]:
        if isinstance(exc, KeyboardInterrupt):
            return "interrupted (Ctrl-C)", 130
        if isinstance(exc, InputError):
            return str(exc), 2
        if exc is not None and is_out_of_memory(exc):
            return f"out of memory: {describe_exception(exc)}", 2
        return describe_exception(exc) if exc is not None else "stopped", 1


class Trainer:
    def __init__(self, task: Task, settings: RunSettings, log, device: torch.device | None = None,
                 dist_ctx: DistContext | None = None):
        self.task, self.s, self.log, self.dist = task, settings, log, dist_ctx
        self.device = device or resolve_device(settings.device, log)
        torch.manual_seed(settings.seed)
        self.model = task.model.to(self.device)  # the checks, snapshots and replays work on the bare module
        self.wrapped = self.model  # what the training step calls: DDP under torchrun
        if dist_ctx is not None:
            from torch.nn.parallel import DistributedDataParallel

            self.wrapped = DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None,
                broadcast_buffers=False)
            torch.manual_seed(settings.seed + dist_ctx.rank)  # per-rank dropout streams; weights came from rank 0
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = self.make_optimizer(params)
        warmup = max(1, settings.warmup_steps)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda i: min(1.0, (i + 1) / warmup))
        self.autocast_dtype = AUTOCAST_DTYPES.get(settings.precision)
        self.scaler = torch.amp.GradScaler(self.device.type) if settings.precision == "fp16" else None
        self.accum = settings.gradient_accumulation_steps
        self.watch = Watch(self.model, self.optimizer)
        self.agree = (lambda code: agree(code, dist_ctx)) if dist_ctx is not None else None  # for watch.sync
        self.watch.detailed = settings.trace_every_step
        # two snapshots: the parameter check of step k runs at the first sync of step k + 1
        self.snapshots = [Snapshot(self.model, self.optimizer, self.scaler, self.scheduler) for _ in range(2)]
        self.pinpointer = Pinpointer(self)
        self.history = History()
        self.bundle_dir: str | None = None  # where findings write repro bundles (None: no bundles)

    def make_optimizer(self, params) -> torch.optim.Optimizer:
        """The task's optimizer(params), checked, or AdamW at --lr / --weight-decay."""
        if self.task.optimizer is None:
            return torch.optim.AdamW(params, lr=self.s.lr, weight_decay=self.s.weight_decay)
        try:
            optimizer = self.task.optimizer(params)
        except Exception as exc:
            raise InputError(f"--task {self.task.spec}: optimizer(params) raised {describe_exception(exc)}.") from None
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InputError(f"--task {self.task.spec}: optimizer(params) must return a torch.optim.Optimizer, got "
                             f"{type(optimizer).__name__}.")
        return optimizer

    # -- the pieces of a step, shared by the run and the replay ---------------------------------------------
    def autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)

    def compute_loss(self, batch, replay: bool = False) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The task's loss (in autocast). A replay calls the bare module: no DDP collectives, one rank alone."""
        self.model.train()
        with self.autocast():
            out = self.task.loss(self.model if replay else self.wrapped, batch)
        return split_loss(out)

    def backward(self, loss: torch.Tensor) -> None:
        scaled = loss / self.accum
        (self.scaler.scale(scaled) if self.scaler is not None else scaled).backward()

    def clip_and_step(self, grad_norms: list[torch.Tensor] | None) -> None:
        """Clip with the norms the watch already computed (no second pass), then step (the scaler may skip)."""
        grads = [p.grad for p in self.watch_params() if p.grad is not None]
        if self.s.max_grad_norm and grads:
            norms = grad_norms if grad_norms else torch._foreach_norm(grads)
            total = torch.linalg.vector_norm(torch.stack([n.to(self.device) for n in norms]))
            coef = torch.clamp(self.s.max_grad_norm / (total + 1e-6), max=1.0)
            torch._foreach_mul_(grads, coef.to(grads[0].device))
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.step_schedule()

    def step_schedule(self) -> None:
        with warnings.catch_warnings():  # a step the fp16 scaler skipped still advances the schedule
            warnings.simplefilter("ignore", UserWarning)
            self.scheduler.step()

    def watch_params(self) -> list[torch.nn.Parameter]:
        return [p for _, p in self.watch.named_params]

    # -- the loop ---------------------------------------------------------------------------------------------
    def batch_stream(self):
        """Micro-batches forever, re-iterating task.batches. Under DDP each rank takes every world-th micro-batch
        (unless the task shards itself, like the built-in one), counted across passes, so even a single batch
        reaches every rank."""
        shard = self.dist is not None and not getattr(self.task.batches, "sharded", False)
        dealt = 0
        while True:
            produced = 0
            for batch in self.task.batches:
                produced += 1
                if not shard or dealt % self.dist.world == self.dist.rank:
                    yield batch
                dealt += 1
            if produced == 0:
                if dealt:
                    raise InputError(f"The task's `batches` ({self.task.name}) ran dry after {dealt} micro-batches: "
                                     f"give an iterable that starts over when iterated again (a list, or an object "
                                     f"whose __iter__ restarts), not a one-shot generator.")
                raise InputError(f"The task's `batches` ({self.task.name}) yielded no micro-batch.")

    def run(self) -> RunResult:
        s, log = self.s, self.log
        result = RunResult(status="clean", steps_run=0, history=self.history)
        stream = self.batch_stream()
        previous: StepInputs | None = None
        # progress on stderr only when it is a terminal: under `2>&1 | tee` the log stays clean
        bar = tqdm(total=s.max_steps, desc="debug-nan", unit="step", file=sys.stderr, leave=False,
                   disable=not sys.stderr.isatty())
        try:
            for step in range(1, s.max_steps + 1):
                finding, inputs = self.train_step(step, stream, previous)
                result.steps_run = step
                bar.update(1)
                if finding is not None:
                    result.findings.append(finding)
                    if not s.keep_going:
                        break
                    log("--keep-going: skipping this step's update and going on.", "yellow")
                    # an optimizer-phase finding is the previous step's update: undo that one
                    bad_update = finding.phase == "optimizer" and previous is not None
                    (previous if bad_update else inputs).snapshot.restore()
                    self.optimizer.zero_grad(set_to_none=True)
                    previous = None
                    continue
                previous = inputs
            else:
                # the parameter check of the last step: one more sync (and agreement under DDP)
                final = self.watch.sync(self.agree)
                finding = self.decide(final, final.first_harm(), None, previous, self.accum, None, previous)
                if finding is not None:
                    result.findings.append(finding)
        except KeyboardInterrupt:
            result.interrupted = True
            log("Interrupted (Ctrl-C): writing the partial summary.", "yellow")
        except TaskFailure as failure:
            result.error = str(failure)
        except RunAborted as abort:
            result.error, result.exit_code = str(abort), abort.exit_code
            result.interrupted = abort.exit_code == 130
        finally:
            bar.close()
        result.finding = result.findings[0] if result.findings else None
        if result.finding is not None:
            result.status = "nonfinite"
        elif result.error is not None:
            result.status = "error"
        return result

    def train_step(self, step: int, stream, previous: StepInputs | None) -> tuple[Finding | None, StepInputs]:
        """One optimizer step with every check: snapshot, micro-batches, explosion check, clip, step."""
        started = time.perf_counter()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        snapshot = self.snapshots[step % 2]
        snapshot.save()
        inputs = StepInputs(step=step, batches=[], rng=[], snapshot=snapshot)
        rec = self.history.begin(step)
        rec.lr = self.optimizer.param_groups[0]["lr"]
        self.log()
        self.log.rule(f"STEP {step}/{self.s.max_steps}" +
                      (f" (micro-batches 1..{self.accum})" if self.accum > 1 else ""))
        self.optimizer.zero_grad(set_to_none=True)
        for micro in range(1, self.accum + 1):
            finding = self.micro_step(inputs, micro, stream, rec, previous)
            if finding is not None:
                return finding, inputs
            if rec.scaler_skipped:
                break
        rec.finish()
        if rec.scaler_skipped:  # what GradScaler.step/update do on an overflow: no update, a lower scale
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.update(self.scaler.get_scale() * self.scaler.get_backoff_factor())
            self.scaler._growth_tracker.zero_()
            self.step_schedule()
        else:
            if self.dist is not None:
                self.last_grad_norms = self.allreduce_gradients(rec)
            finding = self.check_explosion(rec)
            if finding is not None:
                return finding, inputs
            self.clip_and_step(self.last_grad_norms)
            self.watch.watch_params()
        rec.seconds = time.perf_counter() - started
        if self.device.type == "cuda":
            rec.peak_memory_mb = torch.cuda.max_memory_allocated(self.device) / 2**20
        self.log_step(rec)
        return None, inputs

    def micro_step(self, inputs: StepInputs, micro: int, stream, rec: StepRecord,
                   previous: StepInputs | None) -> Finding | None:
        """Fetch, forward, loss, backward and the watch for one micro-batch; a Finding if something tripped.

        Under DDP a reason to stop that is not numerical (bad input, out of memory, Ctrl-C) on one rank is
        carried through the same agreement as a trip, so that no rank is left waiting in a collective."""
        log = self.log
        last = micro == self.accum
        error = abort = None
        self.last_grad_norms = None
        # under DDP every backward runs in no_sync(): the ranks first agree that nothing tripped, and only then
        # are the gradients all-reduced (allreduce_gradients), so a rank that raised can never strand the others
        no_sync = self.wrapped.no_sync() if self.dist is not None else nullcontext()
        try:
            raw = next(stream)
            inputs.batches.append(raw)
            inputs.rng.append(capture_rng(self.device))
            batch = move_to(raw, self.device)
            if self.task.describe_batch is not None:
                for line in self.task.describe_batch(raw):
                    log(f"  [data{f' {micro}' if self.accum > 1 else ''}] {line}",
                        "yellow" if line.startswith("WARNING") else None)
            with no_sync:
                self.watch.watch_batch(batch)
                loss, parts = self.compute_loss(batch)
                self.watch.watch_loss(loss, parts)
                self.backward(loss)
            if last and self.scaler is not None:
                self.scaler.unscale_(self.optimizer)
            self.last_grad_norms = self.watch.watch_grads()
        except (InputError, KeyboardInterrupt) as exc:
            if self.dist is None:
                raise
            abort = exc
        except Exception as exc:  # user code raising mid-step (e.g. a loss that raises on NaN) is a trip
            if is_out_of_memory(exc) and self.dist is None:
                raise
            if is_out_of_memory(exc):
                abort = exc
            else:
                error = exc
        result = self.watch.sync(self.agree, raised=error is not None, abort=abort is not None)
        if abort is None:
            self.history.add_micro(rec, result, last)
        if self.s.trace_every_step and result.layer_stats:
            log(f"  [trace{f' {micro}' if self.accum > 1 else ''}] layer-by-layer (module outputs, in order):")
            for name, stats in result.layer_stats.items():
                log(f"    {name}: {stats.line()}")
        return self.decide(result, result.first_harm(), error, inputs, micro, rec, previous, abort)

    def decide(self, result, bad, error, inputs: StepInputs | None, micro: int, rec: StepRecord | None,
               previous: StepInputs | None, abort: BaseException | None = None) -> Finding | None:
        """Trip or not, from this micro-batch's checks. Under DDP every rank decides the same from the
        all-reduced codes; the first rank to see it pinpoints and the finding is broadcast."""
        if self.dist is not None:
            return self.decide_across_ranks(result, bad, error, inputs, micro, rec, previous, abort)
        if bad is None and error is None:
            return None
        if error is None and bad.kind == "grad" and self.scaler_overflow(inputs, micro, rec):
            return None
        return self.pinpoint_trip(bad, error, inputs, micro, previous)

    def pinpoint_trip(self, bad, error, inputs: StepInputs, micro: int, previous: StepInputs | None,
                      trace: bool = True) -> Finding | None:
        if bad is not None and bad.kind == "param":  # the previous step's optimizer update
            if previous is None:
                return None
            return self.pinpointer.pinpoint(previous, self.accum, bad, None, optimizer=True, trace=trace)
        return self.pinpointer.pinpoint(inputs, micro, bad, error)

    def scaler_overflow(self, inputs: StepInputs, micro: int, rec: StepRecord, probe: bool | None = None) -> bool:
        """Only the gradients went non-finite under an fp16 loss scale. Expected (and the step skipped) when the
        same micro-batches give finite gradients without the scale; otherwise it is a real finding."""
        if self.scaler is None or rec is None:
            return False
        scale = self.scaler.get_scale()
        if probe is None:
            probe = scale >= 1.0 and self.pinpointer.finite_without_scaling(inputs, micro)
        if not probe:
            return False
        rec.scaler_skipped = True
        self.log(f"  [fp16] gradient scaler overflow at scale {scale:g} (finite without the scale): step skipped, "
                 f"scale lowered (expected).")
        return True

    def decide_across_ranks(self, result, bad, error, inputs: StepInputs, micro: int, rec: StepRecord,
                            previous: StepInputs | None, abort: BaseException | None) -> Finding | None:
        """Every rank takes the same decision from the all-reduced codes; the first rank pinpoints, all learn."""
        from debug_nan.checks.watch import ABORT_CODE, CODE_PHASE, PHASE_CODE
        from debug_nan.train.distributed import broadcast

        codes = result.rank_codes
        top = max(codes)
        if top == 0:
            return None
        first = [r for r, c in enumerate(codes) if c == top]
        src = first[0]
        if top == ABORT_CODE:  # every rank stops; the first aborting rank says why
            reason = broadcast(RunAborted.describe(abort) if self.dist.rank == src else None, src)
            raise RunAborted(f"rank {src}: {reason[0]}", reason[1])
        if top == PHASE_CODE["grad"] and self.scaler is not None and rec is not None:
            # the ranks whose own gradients tripped probe them without the loss scale; all agree on the verdict
            genuine = 1.0 if bad is not None and not (self.scaler.get_scale() >= 1.0 and
                                                      self.pinpointer.finite_without_scaling(inputs, micro)) else 0.0
            verdict = agree(torch.tensor(genuine, device=self.device), self.dist).tolist()
            if max(verdict) == 0.0 and self.scaler_overflow(inputs, micro, rec, probe=True):
                return None
            first = [r for r, v in enumerate(verdict) if v > 0] or first
            src = first[0]
        self.log(f"  [ddp] trip seen by rank(s) {first} first (phase {CODE_PHASE[int(top)]}); "
                 f"rank {src} pinpoints, the others wait.", "red")
        outcome = None
        try:
            if top == PHASE_CODE["param"]:
                # every rank re-runs its share of the step and the gradients are averaged as in the run; the
                # pinpointing rank then traces the optimizer step alone
                outcome = self.pinpoint_trip(bad, None, previous, self.accum, previous, trace=self.dist.rank == src)
            elif self.dist.rank == src:
                outcome = self.pinpoint_trip(bad, error, inputs, micro, previous)
        except TaskFailure as failure:
            outcome = failure
        except BaseException as exc:  # noqa: BLE001 - the other ranks wait for this rank's answer
            outcome = RunAborted(f"rank {src} failed while pinpointing: {describe_exception(exc)}", 1)
        outcome = broadcast(outcome if self.dist.rank == src else None, src)
        if isinstance(outcome, (TaskFailure, RunAborted)):
            raise outcome
        if outcome is not None:
            outcome.rank, outcome.first_ranks = src, first
        return outcome

    def average_gradients(self) -> list[tuple[str, torch.nn.Parameter]]:
        """DDP: average the gradients over the ranks (every rank must call this). Returns the parameters that
        have a gradient: one that no rank used stays None, as in a single process."""
        from debug_nan.train.distributed import allreduce_mean, used_anywhere

        named = list(self.watch.named_params)
        used = used_anywhere([p.grad is not None for _, p in named], self.dist)
        named = [(n, p) for (n, p), u in zip(named, used) if u]
        for _, p in named:
            if p.grad is None:  # unused on this rank only: the others have a gradient
                p.grad = torch.zeros_like(p)
        allreduce_mean([p.grad for _, p in named], self.dist)
        return named

    def allreduce_gradients(self, rec: StepRecord) -> list[torch.Tensor]:
        """DDP: average the gradients (nothing tripped anywhere, so every rank is here), then read their global
        norms for the history, the explosion check and clipping, identical on every rank."""
        named = self.average_gradients()
        norms = torch._foreach_norm([p.grad for _, p in named])
        values = torch.stack([n.double() for n in norms]).cpu().tolist()  # one more sync per step, DDP only
        rec.grad_norms = {name: v for (name, _), v in zip(named, values)}
        rec.grad_norm = math.sqrt(sum(v * v for v in values))
        return list(norms)

    def check_explosion(self, rec: StepRecord) -> Finding | None:
        hit = self.history.explosion(self.s.explosion_threshold, self.s.explosion_growth)
        if hit is None:
            return None
        return self.pinpointer.explosion(rec, hit[1], self.history.steps, self.accum)

    def log_step(self, rec: StepRecord) -> None:
        parts = ", ".join(f"{k} {v:.4g}" for k, v in rec.parts.items())
        loss = f"loss {rec.loss:.5g}" + (f" ({parts})" if parts else "") if rec.loss is not None else "loss -"
        line = [loss]
        if rec.grad_norm is not None and not rec.scaler_skipped:
            clip = self.s.max_grad_norm
            line.append(f"grad norm {rec.grad_norm:.4g}" + (f" (clipped to {clip:g})" if clip and
                                                             rec.grad_norm > clip else ""))
        line.append(f"lr {rec.lr:.3g}")
        if rec.seconds is not None:
            line.append(f"{rec.seconds:.2f} s")
        if rec.peak_memory_mb is not None:
            line.append(f"peak CUDA memory {rec.peak_memory_mb:,.0f} MiB")
        self.log("  [watch] " + " | ".join(line))
        if rec.grad_norms:
            top = sorted(rec.grad_norms.items(), key=lambda kv: -kv[1] if math.isfinite(kv[1]) else -math.inf)[:3]
            self.log("  [grads] largest: " + ", ".join(f"{n} {v:.3g}" for n, v in top))
        if rec.activations:
            name, value = max(rec.activations.items(), key=lambda kv: kv[1])
            self.log(f"  [acts]  {len(rec.activations)} module outputs finite; largest |x| {value:.4g} in "
                     f"{name or '<model>'}")
        if rec.scaler_skipped:
            self.log("  [ok] module outputs and loss finite; gradients overflowed the fp16 loss scale (step skipped)")
        else:
            self.log("  [ok] every module output, the loss and every gradient are finite", "green")
