"""debug-nan inside a PyTorch Lightning run: one callback.

    from debug_nan.drivers.lightning import DebugNaNCallback

    trainer = L.Trainer(..., callbacks=[DebugNaNCallback(report="debug-nan.json")])
    trainer.fit(model, datamodule)

Lightning calls, per micro-batch of automatic optimization: on_train_batch_start(batch) -> training_step ->
on_before_backward(loss) -> backward -> (last micro-batch of the accumulation: unscale (fp16) ->
on_before_optimizer_step -> clip -> optimizer step) -> on_train_batch_end. The watch opens in the first hook,
syncs once in on_before_optimizer_step (last micro-batch: gradients unscaled, not yet clipped) or on_train_batch_end
(the others), and reads the parameters after the step. A replay calls `training_step(batch, batch_idx)` of the bare
LightningModule (no DDP wrapper, `self.log` muted) under the precision plugin's autocast, then Lightning's
accumulation scaling, the loss scaler and `LightningModule.backward`; an optimizer-phase replay clips through
`configure_gradient_clipping` and steps the optimizer (through the scaler in fp16).
"""

from __future__ import annotations

import os
from contextlib import contextmanager

import torch

try:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
    from lightning.pytorch.utilities.signature_utils import is_param_in_hook_signature
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("debug_nan.integrations.lightning needs PyTorch Lightning: pip install "
                      "'debug-nan[lightning]'") from exc

from debug_nan.drivers import ddp
from debug_nan.drivers.eval_forwards import ForwardsOutsideTraining
from debug_nan.drivers.framework import FrameworkDriver
from debug_nan.drivers.framework_outputs import FrameworkCallback
from debug_nan.drivers.monitor import NonFiniteError
from debug_nan.drivers.task import split_loss
from debug_nan.errors import InputError

PRECISIONS = {"16-mixed": "fp16", "bf16-mixed": "bf16"}


class LightningDriver(FrameworkDriver):
    framework = "Lightning"
    dialect = "lightning"

    def __init__(self, trainer: pl.Trainer, module: pl.LightningModule, settings, log, bundle_dir):
        self.trainer, self.module = trainer, module
        super().__init__(module, trainer.optimizers[0], settings, log,
                         scaler=getattr(trainer.precision_plugin, "scaler", None), dist_ctx=ddp.context(),
                         bundle_dir=bundle_dir,
                         scheduler=trainer.lr_scheduler_configs[0].scheduler if trainer.lr_scheduler_configs else None)
        self.batch_idx = 0
        self.passes_batch_idx = is_param_in_hook_signature(module.training_step, "batch_idx", min_args=2)

    @contextmanager
    def _quiet(self):
        """A replay's self.log calls must not reach the run's metrics."""
        self.module.log = self.module.log_dict = lambda *args, **kwargs: None
        try:
            yield
        finally:
            del self.module.log, self.module.log_dict

    # -- the StepDriver methods: Lightning's step, for the replay ---------------------------------------------
    def replay_loss(self, batch, tape=None):
        args = (batch, self.batch_idx) if self.passes_batch_idx else (batch,)
        with self._quiet(), self.trainer.precision_plugin.train_step_context():
            out = self.module.training_step(*args)
        if out is None:
            raise RuntimeError("training_step returned None in the replay of a micro-batch it trained on")
        return split_loss(out)

    def share_of_step(self, loss: torch.Tensor) -> torch.Tensor:
        return loss / self.trainer.accumulate_grad_batches

    def run_backward(self, loss: torch.Tensor, scaled: bool) -> None:
        self.module.backward(self.scaled(loss, scaled))

    def clip_gradients(self) -> None:
        """As Lightning's precision plugin, after the unscale: configure_gradient_clipping."""
        t = self.trainer
        if t.gradient_clip_val:
            self.module.configure_gradient_clipping(self.optimizer, gradient_clip_val=t.gradient_clip_val,
                                                    gradient_clip_algorithm=t.gradient_clip_algorithm)

    def raw_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """on_before_backward's loss is divided by the accumulation (and times the fp16 scale): undo both on the
        device, so that the history shows the loss training_step returned."""
        loss = loss.detach().float() * self.trainer.accumulate_grad_batches
        return loss / self.scaler._scale if self.scaler is not None else loss


class DebugNaNCallback(FrameworkCallback, pl.Callback):
    """Watch every training micro-batch; on the first NaN/Inf (or gradient explosion) pinpoint its origin, print
    the summary, write the JSON report and the repro bundle, and stop training.

    Options (framework_outputs.py's CallbackOptions): report, bundle_dir, bundle, log, on_trip ("stop":
    trainer.should_stop, the model left at its last finite state; "raise": debug_nan.NonFiniteError out of
    trainer.fit), task (a `--task` spec that rebuilds this LightningModule, recorded in bundles so that
    `debug-nan replay BUNDLE` works), explosion_threshold / explosion_growth, snapshot_every, outputs_every.
    After fit: `.finding` (a Finding or None) and `.status` ("clean" | "nonfinite" | "error").
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._stepping = False

    # -- Lightning hooks ---------------------------------------------------------------------------------------
    def on_sanity_check_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.on_train_start(trainer, pl_module)  # (the sanity check's validation forwards are watched too)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.driver is not None:
            return
        _check_supported(trainer, pl_module)
        log = self.outputs.open(trainer.global_rank)
        settings = self.options.settings(
            self.outputs, device=pl_module.device, optimizer=trainer.optimizers[0],
            accumulation=trainer.accumulate_grad_batches, precision=PRECISIONS.get(str(trainer.precision), "fp32"),
            max_grad_norm=trainer.gradient_clip_val if trainer.gradient_clip_algorithm == "norm" else None,
            max_steps=trainer.max_steps, seed=_seed())
        self.driver = LightningDriver(trainer, pl_module, settings, log, self.outputs.bundle_dir)
        # validation_step's forwards (and the sanity check's): the module's and its children's with parameters
        modules = [pl_module, *(c for c in pl_module.children() if next(c.parameters(), None) is not None)]
        self.outside = ForwardsOutsideTraining(self.driver, modules, lambda: trainer.global_step,
                                               lambda finding: self._found_outside(trainer, finding))
        if trainer.global_rank == 0:
            log(f"[debug-nan] watching {type(pl_module).__name__} in Lightning {pl.__version__} ({trainer.precision}, "
                f"accumulate_grad_batches {trainer.accumulate_grad_batches}, world size {trainer.world_size})")

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx: int) -> None:
        m = self.driver
        m.batch_idx = batch_idx
        self._stepping = False
        m.begin(batch, first=batch_idx % trainer.accumulate_grad_batches == 0, step=trainer.global_step + 1)

    def on_before_backward(self, trainer, pl_module, loss: torch.Tensor) -> None:
        self.driver.watch_loss(self.driver.raw_loss(loss))

    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        self._stepping = True
        self._end(trainer, last=True)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        if self._stepping:
            self.driver.stepped()
        else:
            self._end(trainer, last=False)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        m = self.driver
        if m is None or isinstance(exception, NonFiniteError) or self.outputs.result is not None:
            return
        if isinstance(exception, KeyboardInterrupt):
            m.stopped = True
            self._conclude(trainer, interrupted=True)
            return
        if m.watch.enabled:  # user code raised inside a training micro-batch: a trip, as in the CLI
            m.end(last=self._stepping, error=exception)
        m.stopped = True
        self._conclude(trainer, error=exception, alone=True)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.driver is None:
            return
        if self.outputs.result is None:
            self.driver.finish()
            self._conclude(trainer)
        if self.driver.findings:  # the NaN gradient that made an fp16 scaler skip the last step is not kept
            pl_module.zero_grad(set_to_none=True)

    # -- a trip ------------------------------------------------------------------------------------------------
    def _found_outside(self, trainer, finding) -> None:
        if not self.found_outside(finding):
            return
        self._conclude(trainer)
        trainer.should_stop = True
        if self.outputs.on_trip == "raise":
            raise NonFiniteError(self.driver.findings[0])

    def _end(self, trainer, last: bool) -> None:
        finding = self.driver.end(last)
        if not self.driver.stopped:
            return
        self._conclude(trainer)
        trainer.should_stop = True
        if self.outputs.on_trip == "raise" and finding is not None:
            raise NonFiniteError(finding)

    def _conclude(self, trainer, error: BaseException | None = None, interrupted: bool = False,
                  alone: bool = False) -> None:
        rank = trainer.global_rank
        self.conclude({
            "framework": "lightning", "version": pl.__version__, "precision": str(trainer.precision),
            "accumulate_grad_batches": trainer.accumulate_grad_batches, "strategy": type(trainer.strategy).__name__,
            "world_size": trainer.world_size, "global_step": trainer.global_step,
        }, write=rank == 0 or alone, error=error, interrupted=interrupted, rank=rank)


def _seed() -> int | None:
    """The seed the script gave Lightning (seed_everything), or None: it set none."""
    seed = os.environ.get("PL_GLOBAL_SEED")  # (seed_everything writes it)
    return int(seed) if seed is not None else None


def _check_supported(trainer: pl.Trainer, module: pl.LightningModule) -> None:
    if not module.automatic_optimization:
        raise InputError("DebugNaNCallback supports automatic optimization only: with automatic_optimization = "
                         "False the training_step steps the optimizer itself, so a micro-batch cannot be replayed "
                         "alone. Use debug_nan.Monitor around your manual step instead.")
    if len(trainer.optimizers) != 1:
        raise InputError(f"DebugNaNCallback needs exactly one optimizer (found {len(trainer.optimizers)}).")
    if not isinstance(trainer.strategy, (SingleDeviceStrategy, DDPStrategy)):
        raise InputError(f"DebugNaNCallback supports one device or DDP; {type(trainer.strategy).__name__} shards "
                         f"parameters or optimizer state, which the snapshot and the replay cannot restore.")
    if isinstance(trainer.optimizers[0], torch.optim.LBFGS):
        raise InputError("DebugNaNCallback cannot replay LBFGS, whose step re-evaluates the loss in a closure.")
