"""Mixed precision: the CLI's --precision (autocast for bf16 / fp16, and for fp16 the gradient scaler), the
autocast state a recorded call ran under (`debug-nan run` replays each call in it), and the loss scale's overflow
rule.

Under an fp16 loss scale, gradients that overflow only because of the scale are GradScaler's business: it skips
the step and lowers the scale. Such a trip is expected when the same micro-batches give finite gradients at scale 1
(the pinpointer's probe decides, only where the scale is above 1: `may_overflow`); otherwise it is a real finding.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager, nullcontext

import torch

from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.vocabulary import Cause, Phase

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# the device types whose autocast state a recorded call keeps (torch.autocast's others, xpu / hpu / mps, are not
# read: each costs a call on every recorded op)
AUTOCAST_DEVICES = ("cpu", "cuda")
_any_autocast = getattr(torch._C, "_is_any_autocast_enabled", None)


def autocast_state() -> tuple:
    """The autocast state in force: ((device type, dtype, cache enabled), ...) for each device type where autocast
    is on, () where it is off everywhere (the usual case: one C call). No tensor is read: no host sync."""
    if _any_autocast is not None and not _any_autocast():
        return ()
    return tuple((d, torch.get_autocast_dtype(d), torch.is_autocast_cache_enabled()) for d in AUTOCAST_DEVICES
                 if torch.is_autocast_enabled(d))


@contextmanager
def autocast_as(state: tuple | None):
    """Inside: exactly the autocast state `state` (autocast_state()'s), whatever is in force around it (a replay
    may run inside the script's own autocast region, or outside the one the call ran in). None: left as it is."""
    if state is None:
        yield
        return
    wanted = {d: (dtype, cache) for d, dtype, cache in state}
    with ExitStack() as stack:
        for device in AUTOCAST_DEVICES:
            if device in wanted:
                dtype, cache = wanted[device]
                stack.enter_context(torch.autocast(device, dtype=dtype, cache_enabled=cache))
            elif torch.is_autocast_enabled(device):
                stack.enter_context(torch.autocast(device, enabled=False))
        yield


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def unscaled(scaler, optimizer) -> bool:
    """Has scaler.unscale_(optimizer) run in this step (the gradients hold their true values)?"""
    from torch.amp.grad_scaler import OptState

    return scaler._per_optimizer_states[id(optimizer)]["stage"] is OptState.UNSCALED


def may_overflow(scaler) -> bool:
    """Could a step's non-finite gradients be the loss scale's doing (`scaler`: an enabled GradScaler)? Only where
    the scale is above 1: at a scale of 1 or below, the gradients are at most their true values, so a non-finite
    one is no overflow of the scale's. Reads the scale: a host sync, taken only on a trip."""
    return scaler is not None and scaler.get_scale() > 1.0


def scaled_step(optimizer, scaler=None, clip=None) -> None:
    """An optimizer step as a GradScaler loop takes it: unscale (unless done already this step), `clip()` the true
    gradients, step through the scaler (it skips a step whose gradients are non-finite) and update the scale."""
    if scaler is not None and not unscaled(scaler, optimizer):
        scaler.unscale_(optimizer)
    if clip is not None:
        clip()
    if scaler is not None:
        scaler.step(optimizer)
        scaler.update()
    else:
        optimizer.step()


class Precision:
    def __init__(self, name: str, device: torch.device):
        self.name = name
        self.device_type = device.type
        self.autocast_dtype = AUTOCAST_DTYPES.get(name)
        self.scaler = torch.amp.GradScaler(device.type) if name == "fp16" else None

    def autocast(self):
        if self.autocast_dtype is None:
            return nullcontext()
        return torch.autocast(self.device_type, dtype=self.autocast_dtype)

    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self.scaler.scale(loss) if self.scaler is not None else loss

    def unscale(self, optimizer: torch.optim.Optimizer) -> None:
        """Once per step, after the last backward: the watch and clipping read true gradients."""
        if self.scaler is not None:
            self.scaler.unscale_(optimizer)

    def skip_step(self) -> str:
        """What GradScaler.step/update do on an overflow: no update, a lower scale, the growth count reset.
        Returns the log line."""
        scale = self.scaler.get_scale()
        self.scaler.update(scale * self.scaler.get_backoff_factor())
        self.scaler._growth_tracker.zero_()
        return (f"  [fp16] gradient scaler overflow at scale {scale:g} (finite without the scale): step skipped, "
                f"scale lowered (expected).")


# consecutive steps skipped by a GradScaler (each probed: finite at scale 1) after which the skipping is a finding
# of its own: more than the 16 halvings that bring the default initial scale 65536 to 1, past which a non-finite
# gradient is no overflow of the scale's (may_overflow)
SKIPS_FINDING = 32


def scale_words(scale: float) -> str:
    """65536 -> "65536", 2.6e5 -> "2.6e5", 0.5 -> "0.5": a loss scale as the log shows it."""
    if scale >= 1e5 or 0 < scale < 1e-3:
        mantissa, exponent = f"{scale:.2g}".split("e")
        return f"{mantissa}e{int(exponent)}"
    return f"{scale:g}"


class SkipRun:
    """The steps a GradScaler is skipping one after the other (each probed: its gradients finite at scale 1, so the
    scale's overflow), told as ONE log line when the run ends: "steps 1-6 skipped by the GradScaler: scale 1.7e7 ->
    2.6e5"; SKIPS_FINDING of them in a row are a finding."""

    def __init__(self):
        self.first: int | None = None  # the run's first and last step, and the scales they ran at
        self.last: int | None = None
        self.scale: float | None = None
        self.last_scale: float | None = None
        self.backoff = 0.5  # the scaler's backoff factor (GradScaler multiplies its scale by it at each skip)

    @property
    def count(self) -> int:
        return 0 if self.first is None else self.last - self.first + 1

    def add(self, o, scaler) -> Finding | None:
        """Micro-batch outcome `o`'s step is skipped (its scale: the record's, read at its first sync) -> the
        finding when the run reached SKIPS_FINDING steps, else None."""
        step, scale = o.inputs.step, o.record.loss_scale if o.record.loss_scale is not None else scaler.get_scale()
        if self.first is None or step > self.last + 1:
            self.first, self.scale = step, scale
        self.last, self.last_scale, self.backoff = step, scale, scaler.get_backoff_factor()
        if self.count < SKIPS_FINDING:
            return None
        return skipped_steps_finding(self, step, o.micro, self.after(), o.check.nonfinite)

    def after(self) -> float:
        """The scale after the run's last skip."""
        return self.last_scale * self.backoff

    def end(self, log) -> None:
        """The run ended (a step was not skipped, a finding, the end of training): its one log line."""
        if self.first is None:
            return
        steps = f"step {self.first}" if self.first == self.last else f"steps {self.first}-{self.last}"
        log(f"  [scaler] {steps} skipped by the GradScaler: scale {scale_words(self.scale)} -> "
            f"{scale_words(self.after())} (gradients finite at scale 1: the loss scale's overflow, not a finding)")
        self.first = self.last = self.scale = self.last_scale = None


def skipped_steps_finding(run: SkipRun, step: int, micro: int, scale_now: float, kind: str) -> Finding:
    """The GradScaler skipped SKIPS_FINDING steps in a row: the model has not been updated since, although each
    step's gradients were finite at scale 1."""
    since = "since the run began" if run.first == 1 else f"since step {run.first - 1}"
    explanation = (f"The GradScaler skipped {run.count} steps in a row (steps {run.first}-{run.last}) and the model "
                   f"has not been updated {since}: each step's gradients went {kind.upper()} under the loss "
                   f"scale, and each time they were finite at scale 1 (the probe's replay), so each was the "
                   f"scale's overflow, as the scaler takes it. Its scale fell from {scale_words(run.scale)} to "
                   f"{scale_words(scale_now)} and the scaled gradients still overflow (float16 at 65504, float32 "
                   f"at 3.4e38).")
    return Finding(step=step, micro_step=micro, phase=Phase.BACKWARD, module="", module_type="", op=None, kind=kind,
                   cause=Cause.OVERFLOW, explanation=explanation, source=None, suggestions=[
                       "Start the GradScaler lower (torch.amp.GradScaler(init_scale=...); the default is 65536) or "
                       "let it back off faster (backoff_factor, 0.5 by default).",
                       "Under float16 autocast, train in bf16 instead (--precision bf16): float32's range, and no "
                       "GradScaler is needed.",
                       "Look at the gradient norms in the history: gradients near float16's 65504 at scale 1 leave "
                       "no room for any loss scale; normalise or clip what makes them that large."],
                   watch=f"{run.count} consecutive steps skipped by the GradScaler", detected_by="gradient history")
