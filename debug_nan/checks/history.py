"""Per-step history from the watch: loss, gradient norms, and per-layer max |activation|.

It feeds the step lines, the gradient-explosion check, the history table and the JSON report.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from debug_nan.checks.watch import MicroResult


@dataclass
class StepRecord:
    step: int
    loss: float | None = None
    parts: dict[str, float] = field(default_factory=dict)
    grad_norm: float | None = None  # total L2 norm before clipping (accumulated over the step's micro-batches)
    grad_norms: dict[str, float] = field(default_factory=dict)
    activations: dict[str, float] = field(default_factory=dict)  # module -> max |output| over the micro-batches
    lr: float | None = None
    seconds: float | None = None
    peak_memory_mb: float | None = None
    scaler_skipped: bool = False
    micro_batches: int = 0

    def finish(self) -> None:
        """Sums over the micro-batches run -> means."""
        if self.micro_batches:
            if self.loss is not None:
                self.loss /= self.micro_batches
            self.parts = {k: v / self.micro_batches for k, v in self.parts.items()}


def _max(a: float | None, b: float) -> float:
    if a is None or math.isnan(b):
        return b
    return a if a >= b else b


class History:
    def __init__(self):
        self.steps: list[StepRecord] = []

    def begin(self, step: int) -> StepRecord:
        rec = StepRecord(step)
        self.steps.append(rec)
        return rec

    def add_micro(self, rec: StepRecord, result: MicroResult, last: bool) -> None:
        rec.micro_batches += 1
        for name, value in result.values("forward").items():
            rec.activations[name] = _max(rec.activations.get(name), value)
        loss = result.loss()
        if loss is not None:
            rec.loss = loss if rec.loss is None else rec.loss + loss
        for name, value in result.values("loss_part").items():
            rec.parts[name] = rec.parts.get(name, 0.0) + value
        if last:
            grads = result.values("grad_norm")
            rec.grad_norms = grads
            if grads:
                rec.grad_norm = math.sqrt(sum(v * v for v in grads.values()))

    def explosion(self, threshold: float, growth: float) -> tuple[StepRecord, float] | None:
        """The last step if its gradient norm passed `threshold` and grew `growth`-fold over the earlier minimum."""
        last = self.steps[-1] if self.steps else None
        if last is None or last.grad_norm is None or math.isnan(last.grad_norm):
            return None
        earlier = [r.grad_norm for r in self.steps[:-1] if r.grad_norm is not None and math.isfinite(r.grad_norm)]
        if not earlier:
            return None
        floor = min(earlier)  # an infinite last norm (the L2 sum overflowed, every element finite) also counts
        if last.grad_norm > threshold and last.grad_norm > growth * max(floor, 1e-12):
            return last, floor
        return None

    def to_dict(self) -> list[dict]:
        return [{"step": r.step, "loss": r.loss, "parts": r.parts, "grad_norm": r.grad_norm, "lr": r.lr,
                 "seconds": r.seconds, "peak_memory_mb": r.peak_memory_mb, "scaler_skipped": r.scaler_skipped,
                 "max_abs_activation": r.activations, "grad_norms": r.grad_norms} for r in self.steps]
