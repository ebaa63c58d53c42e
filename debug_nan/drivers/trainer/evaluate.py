"""--eval-every N: the validation pass, as the user's run does it, checked like a training step.

Every N optimizer steps and after the last one, the model goes into eval() (each module's own train(False)) and
each held-out batch runs under no_grad (and the run's autocast) through the task's `eval_loss(model, batch)` or
`evaluate(model, batch)` (default: its training `loss`). The built-in pipeline holds out a split of the samples.

Harm in an eval pass: a non-finite value in what that function returns, the loss, every metric, and every output
tensor it hands back (predictions the user's validation reads). No gradient exists and nothing is updated, so
module outputs alone are not harm, as in training. Cost: one host sync per held-out batch (its values in one
copy), no per-layer work.

The watch's forward hooks are taken off for the pass: torch's inference fast paths (nn.TransformerEncoderLayer,
nn.MultiheadAttention) refuse to run while any module carries a forward hook, and the fused kernels are where an
eval-only NaN is born (PYT-8.9). A trip is replayed under the tracer in the same mode (pinpoint.pinpoint_eval,
hooks registered globally), and the finding has phase "eval". Afterwards every module gets back its own training
flag (the flag alone, as a snapshot restore does).
"""

from __future__ import annotations

import math
from itertools import islice

import torch

from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.replay.driver import is_out_of_memory
from debug_nan.engine.replay.snapshot import capture_rng
from debug_nan.engine.stats import capture_batch, flat_tensors, move_to
from debug_nan.engine.vocabulary import CheckKind
from debug_nan.engine.watch.watch import Check
from debug_nan.errors import InputError


def harmed_values(out) -> list[tuple[str, torch.Tensor]]:
    """What an eval function returned -> (name, tensor) for each floating tensor in it (a scalar loss, a dict of
    metrics and outputs, a tuple...). Python numbers become 0-d tensors."""
    if isinstance(out, (int, float)) and not isinstance(out, bool):
        return [("loss", torch.tensor(float(out)))]
    if isinstance(out, dict):
        out = {k: torch.tensor(float(v)) if isinstance(v, (int, float)) and not isinstance(v, bool) else v
               for k, v in out.items()}
    named = [(path or "loss", t) for path, t in flat_tensors(out) if t.is_floating_point() or t.is_complex()]
    return named


def _peak(t: torch.Tensor) -> torch.Tensor:
    """0-d: the value of a scalar, max |x| of a larger tensor (amax propagates NaN; an Inf element gives Inf)."""
    t = t.detach()
    return t.reshape(()).float() if t.numel() == 1 else t.abs().amax().float()


class EvalPass:
    """The validation pass of a Trainer (a StepDriver with `task`, `model`, `device`, `precision`, `watch`,
    `pinpointer`, `log`, `s`)."""

    def __init__(self, trainer):
        self.t = trainer
        task, s = trainer.task, trainer.s.train
        if task.eval_batches is None:
            raise InputError(f"--eval-every {s.eval_every}: the task ({task.name}) has no held-out batches; give it "
                             f"`eval_batches` (and optionally `eval_loss(model, batch)` or `evaluate(model, "
                             f"batch)`), or leave --eval-every out.")
        self.every, self.limit = s.eval_every, s.eval_batches
        self.last_step = trainer.first_step + s.max_steps
        self.fn = task.eval_loss or task.loss
        self.passes = 0
        self._names: list[str] = []

    def due(self, step: int) -> bool:
        return step % self.every == 0 or step == self.last_step

    def evaluate(self, batch) -> list[tuple[str, torch.Tensor]]:
        """The task's eval function on one batch (the model already in eval mode): no_grad, the run's autocast."""
        with torch.no_grad(), self.t.precision.autocast():
            return harmed_values(self.fn(self.t.model, batch))

    def run(self, step: int) -> Finding | None:
        """One pass over the held-out batches after optimizer step `step` -> the finding of the first batch with a
        non-finite value (None when the pass is finite)."""
        t = self.t
        modules = list(t.model.modules())
        flags = [m.training for m in modules]
        t.watch.close()
        t.model.eval()
        losses, n = [], 0
        try:
            for n, raw in enumerate(islice(t.task.eval_batches, self.limit), start=1):
                kept, rng = capture_batch(raw, t.device), capture_rng(t.device)
                check, error = self._check(move_to(raw, t.device), losses)
                if check is not None or error is not None:
                    t.log(f"  [watch] TRIP in the eval pass after step {step}, held-out batch {n}: "
                          + (f"`{check.name}` read {check.value}" if check else f"it raised {error!r}"), "red")
                    return t.pinpointer.pinpoint_eval(step, n, kept, rng, self.evaluate, check, error)
        finally:
            for m, training in zip(modules, flags):
                m.training = training
            t.watch.attach()
        if n == 0:
            raise InputError(f"--eval-every: the task's `eval_batches` ({t.task.name}) yielded no batch.")
        self.passes += 1
        mean = sum(losses) / len(losses) if losses else float("nan")
        t.log(f"  [eval] after step {step}: {n} held-out batch(es) in eval() + no_grad, finite; mean "
              f"{'loss' if 'loss' in self._names else self._names[0] if self._names else 'value'} {mean:.6g}")
        return None

    def _check(self, batch, losses: list[float]) -> tuple[Check | None, BaseException | None]:
        """Evaluate one batch; its values reach the host in one copy -> (the first non-finite value, or the
        exception the eval function raised)."""
        try:
            named = self.evaluate(batch)
        except Exception as exc:  # user code raising mid-pass: replayed like a trip
            if is_out_of_memory(exc):
                raise
            return None, exc
        if not named:
            raise InputError(f"--eval-every: the task's eval function ({self.fn.__name__}) returned "
                             f"{type(named).__name__} without any floating tensor: return the loss (a scalar "
                             f"tensor) or a dict of metrics.")
        values = torch.stack([_peak(v).to(self.t.device) for _, v in named]).tolist()  # the one host sync
        names = self._names = [name for name, _ in named]
        losses.append(values[names.index("loss")] if "loss" in names else values[0])
        for (name, _), value in zip(named, values):
            if not math.isfinite(value):
                return Check(CheckKind.LOSS if name == "loss" else CheckKind.LOSS_PART, name, value), None
        return None, None
