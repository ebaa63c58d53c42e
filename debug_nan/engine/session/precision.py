"""--precision: autocast for bf16 / fp16, and for fp16 the gradient scaler and its overflow policy.

Under an fp16 loss scale, gradients that overflow only because of the scale are GradScaler's business: it skips
the step and lowers the scale. Such a trip is expected when the same micro-batches give finite gradients without
the scale (the pinpointer's probe decides); otherwise it is a real finding.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

AUTOCAST_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def unscaled(scaler, optimizer) -> bool:
    """Has scaler.unscale_(optimizer) run in this step (the gradients hold their true values)?"""
    from torch.amp.grad_scaler import OptState

    return scaler._per_optimizer_states[id(optimizer)]["stage"] is OptState.UNSCALED


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

    def may_overflow(self) -> bool:
        """Could a non-finite gradient be the loss scale's doing? (A scale below 1 cannot overflow anything that
        was finite without it.) Reads the scale: a host sync, taken only on a trip."""
        return self.scaler is not None and self.scaler.get_scale() >= 1.0

    def skip_step(self) -> str:
        """What GradScaler.step/update do on an overflow: no update, a lower scale, the growth count reset.
        Returns the log line."""
        scale = self.scaler.get_scale()
        self.scaler.update(scale * self.scaler.get_backoff_factor())
        self.scaler._growth_tracker.zero_()
        return (f"  [fp16] gradient scaler overflow at scale {scale:g} (finite without the scale): step skipped, "
                f"scale lowered (expected).")
