"""debug-nan inside a Hugging Face `transformers.Trainer` run: one callback, given the trainer.

    from debug_nan.drivers.hf import DebugNaNCallback

    trainer = Trainer(model=model, args=args, train_dataset=train)
    trainer.add_callback(DebugNaNCallback(trainer, report="debug-nan.json"))
    trainer.train()

Callbacks see no batch, and the replay needs the Trainer's own loss code, so the callback takes the trainer and,
for the duration of train(), wraps that instance's `training_step` (an instance attribute, removed again in
on_train_end; the class and other trainers are untouched, a subclass's override is what gets wrapped). Per
micro-batch: the wrapper opens the watch, calls the original training_step (forward, loss, backward), watches its
loss and syncs once. on_step_end (after the optimizer step) reads the parameters. A replay calls
`trainer.compute_loss(model, inputs, num_items_in_batch=...)` on the bare model (no DDP wrapper) under
`compute_loss_context_manager()`, then training_step's accumulation scaling and `accelerator.backward` (the fp16
scaler); an optimizer-phase replay clips at `max_grad_norm` and steps the optimizer (through the scaler in fp16).
"""

from __future__ import annotations

import functools

import torch

try:
    import transformers
    from accelerate.utils import DistributedType
    from transformers import TrainerCallback
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("debug_nan.integrations.hf needs transformers and accelerate: pip install "
                      "'debug-nan[hf]'") from exc

from debug_nan.drivers import ddp
from debug_nan.drivers.eval_forwards import ForwardsOutsideTraining
from debug_nan.drivers.framework import FrameworkDriver
from debug_nan.drivers.framework_outputs import FrameworkCallback
from debug_nan.drivers.monitor import NonFiniteError
from debug_nan.drivers.task import split_loss
from debug_nan.drivers.wrappers import inner
from debug_nan.errors import InputError


class HFDriver(FrameworkDriver):
    framework = "Trainer"
    dialect = "hf"

    def __init__(self, trainer, settings, log, bundle_dir):
        self.trainer = trainer
        # accelerate's AcceleratedOptimizer and AcceleratedScheduler -> the torch optimizer and scheduler
        super().__init__(trainer.model, inner(trainer.optimizer), settings, log, scaler=trainer.accelerator.scaler,
                         dist_ctx=ddp.context(), bundle_dir=bundle_dir,
                         scheduler=inner(getattr(trainer, "lr_scheduler", None), "scheduler"))
        self.num_items = None  # this optimizer step's num_items_in_batch (the loss normaliser), as the run had it
        self.step_micro_batches = trainer.args.gradient_accumulation_steps

    def new_step(self, num_items) -> None:
        self.num_items = num_items
        self.step_micro_batches = getattr(self.trainer, "current_gradient_accumulation_steps",
                                          self.trainer.args.gradient_accumulation_steps)

    def loss_is_scaled_for_accumulation(self) -> bool:
        """training_step's rule: a loss normalised by num_items_in_batch is not divided by the accumulation."""
        t = self.trainer
        fixed = getattr(t, "loss_is_scaled_for_ga", None)
        if fixed is not None:
            return fixed
        return bool(getattr(t, "model_accepts_loss_kwargs", False) and self.num_items is not None) or \
            getattr(t, "compute_loss_func", None) is not None

    # -- the StepDriver methods: the Trainer's step, for the replay -------------------------------------------
    def replay_loss(self, batch, tape=None):
        t = self.trainer
        self.model.train()
        inputs = t._prepare_inputs(batch)  # a new mapping, as in training_step: compute_loss may pop "labels"
        with t.compute_loss_context_manager():
            extra = {"num_items_in_batch": self.num_items} if self.num_items is not None else {}
            loss = t.compute_loss(self.model, inputs, **extra)
        return split_loss(loss)

    def share_of_step(self, loss: torch.Tensor) -> torch.Tensor:
        return loss if self.loss_is_scaled_for_accumulation() else loss / self.step_micro_batches

    def run_backward(self, loss: torch.Tensor, scaled: bool) -> None:
        if scaled:
            self.trainer.accelerator.backward(loss)  # the fp16 scaler's scale(), as in training_step
        else:
            loss.backward()

    def clip_gradients(self) -> None:
        """As the Trainer at the end of a step, after the unscale: clip at max_grad_norm."""
        max_norm = self.trainer.args.max_grad_norm
        if max_norm and max_norm > 0:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), max_norm)

    def watch_step_loss(self, loss: torch.Tensor) -> None:
        """training_step returns the loss it back-propagated (divided by the accumulation, unless normalised by
        num_items_in_batch): undone on the device for the history."""
        loss = loss.detach().float()
        self.watch_loss(loss if self.loss_is_scaled_for_accumulation() else loss * self.step_micro_batches)


class DebugNaNCallback(FrameworkCallback, TrainerCallback):
    """Watch every training micro-batch of `trainer`; on the first NaN/Inf (or gradient explosion) pinpoint its
    origin, print the summary, write the JSON report and the repro bundle, and stop training.

    Options as for the Lightning callback (framework_outputs.py's CallbackOptions): report, bundle_dir, bundle,
    log, on_trip ("stop": control.should_training_stop, the model left at its last finite state; "raise":
    debug_nan.NonFiniteError out of trainer.train()), task (a `--task` spec recorded in bundles),
    explosion_threshold / explosion_growth, snapshot_every, outputs_every. After train(): `.finding` and `.status`.
    """

    def __init__(self, trainer, *args, **kwargs):
        if not isinstance(trainer, transformers.Trainer):
            raise InputError(f"DebugNaNCallback(trainer, ...) needs the transformers.Trainer it watches (got "
                             f"{type(trainer).__name__}): trainer.add_callback(DebugNaNCallback(trainer)).")
        super().__init__(*args, **kwargs)
        self.trainer = trainer
        self._first = True

    # -- Trainer events ----------------------------------------------------------------------------------------
    def on_train_begin(self, args, state, control, **kwargs):
        t = self.trainer
        if self not in t.callback_handler.callbacks:
            raise InputError("DebugNaNCallback was given another Trainer than the one running it.")
        _check_supported(t)
        self.outputs.result = None
        log = self.outputs.open(args.process_index)
        precision, described = resolved_precision(t)
        settings = self.options.settings(
            self.outputs, device=args.device, optimizer=t.optimizer, accumulation=args.gradient_accumulation_steps,
            precision=precision, max_grad_norm=args.max_grad_norm, max_steps=state.max_steps, seed=args.seed)
        self.driver = HFDriver(t, settings, log, self.outputs.bundle_dir)
        self._install()
        # the evaluation loop's forwards (eval_strategy): under no_grad, outside a training micro-batch
        self.outside = ForwardsOutsideTraining(self.driver, [self.driver.model], lambda: t.state.global_step,
                                               self._found_outside)
        if args.process_index == 0:
            log(f"[debug-nan] watching {type(t.model).__name__} in transformers {transformers.__version__} Trainer "
                f"({described}, gradient_accumulation_steps {args.gradient_accumulation_steps}, world size "
                f"{args.world_size})")

    def on_step_begin(self, args, state, control, **kwargs):
        self._first = True

    def on_substep_end(self, args, state, control, **kwargs):
        return self._control(control)

    def on_step_end(self, args, state, control, **kwargs):
        if self.driver is not None:
            self.driver.stepped()
        return self._control(control)

    def on_evaluate(self, args, state, control, **kwargs):
        return self._control(control)

    def on_train_end(self, args, state, control, **kwargs):
        if self.driver is None:
            return
        self._uninstall()
        if self.outputs.result is None:
            self.driver.finish()
            self._conclude()
        if self.driver.findings:  # the NaN gradient that made an fp16 scaler skip the last step is not kept
            self.driver.model.zero_grad(set_to_none=True)
        ddp.let_gloo_workers_finish()

    # -- the wrapped training_step -----------------------------------------------------------------------------
    def _install(self) -> None:
        t = self.trainer
        wrapped = t.__dict__.get("training_step")
        original = getattr(wrapped, "__wrapped__", None) or t.training_step  # not twice after an aborted train()

        @functools.wraps(original)
        def training_step(model, inputs, *args, **kwargs):
            m = self.driver
            if m.stopped:
                return original(model, inputs, *args, **kwargs)
            if self._first:
                m.new_step(args[0] if args else kwargs.get("num_items_in_batch"))
            m.begin(inputs, first=self._first, step=t.state.global_step + 1)
            self._first = False
            last = t.accelerator.sync_gradients
            try:
                loss = original(model, inputs, *args, **kwargs)
            except BaseException as exc:
                self._raised(exc, last)
                raise
            m.watch_step_loss(loss)
            finding = m.end(last)
            if m.stopped:
                self._conclude()
                if self.outputs.on_trip == "raise" and finding is not None:
                    self._uninstall()  # train() ends here without on_train_end
                    raise NonFiniteError(finding)
            return loss

        t.training_step = training_step

    def _uninstall(self) -> None:
        if "training_step" in self.trainer.__dict__:
            del self.trainer.training_step
        if self.outside is not None:
            self.outside.remove()

    def _found_outside(self, finding) -> None:
        """An evaluation forward's finding (FrameworkCallback.found_outside): training stops at the next step's
        end."""
        if not self.found_outside(finding):
            return
        self._conclude()
        if self.outputs.on_trip == "raise":
            self._uninstall()  # train() ends here without on_train_end
            raise NonFiniteError(finding)

    def _raised(self, exc: BaseException, last: bool) -> None:
        """User code raised inside a micro-batch: a trip, as in the CLI; the exception then goes on as it would."""
        m = self.driver
        if isinstance(exc, KeyboardInterrupt):
            m.stopped = True
            self._conclude(interrupted=True)
        elif isinstance(exc, Exception):
            m.end(last, error=exc)
            m.stopped = True
            self._conclude(error=exc, alone=True)
        self._uninstall()

    def _control(self, control):
        if self.driver is not None and self.driver.stopped:
            control.should_training_stop = True
        return control

    def _conclude(self, error: BaseException | None = None, interrupted: bool = False, alone: bool = False) -> None:
        args = self.trainer.args
        self.conclude({
            "framework": "transformers", "version": transformers.__version__,
            "precision": resolved_precision(self.trainer)[0],
            "gradient_accumulation_steps": args.gradient_accumulation_steps, "max_grad_norm": args.max_grad_norm,
            "world_size": args.world_size, "global_step": self.trainer.state.global_step,
        }, write=args.process_index == 0 or alone, error=error, interrupted=interrupted, rank=args.process_index)


def resolved_precision(trainer) -> tuple[str, str]:
    """The precision the run really uses, as accelerate resolved it (not as TrainingArguments asked): fp16 on a
    CPU, for one, runs in fp32 without autocast or a loss scaler -> (settings name, words for the header)."""
    acc = trainer.accelerator
    asked = "fp16" if trainer.args.fp16 else "bf16" if trainer.args.bf16 else None
    mixed = str(getattr(acc, "mixed_precision", "no"))
    if acc.scaler is not None:
        return "fp16", "fp16 autocast with a loss scaler"
    if mixed in ("fp16", "bf16") and getattr(acc, "native_amp", False):
        return mixed, f"{mixed} autocast" + (" without a loss scaler" if mixed == "fp16" else "")
    if asked is not None:
        return "fp32", f"fp32: {asked} was asked, but accelerate runs fp32 on {acc.device} (no autocast, no scaler)"
    return "fp32", "fp32"


def _check_supported(trainer) -> None:
    kind = trainer.accelerator.distributed_type
    if kind not in (DistributedType.NO, DistributedType.MULTI_GPU, DistributedType.MULTI_CPU):
        raise InputError(f"DebugNaNCallback supports one device or DDP; {kind} shards or partitions parameters, "
                         f"gradients or optimizer state, which the snapshot and the replay cannot restore.")
    if trainer.args.n_gpu > 1:
        raise InputError("DebugNaNCallback does not support torch.nn.DataParallel (several GPUs in one process): "
                         "launch with torchrun / accelerate launch for DDP instead.")
