"""Per-step history from the watch: loss, gradient norms, per-layer max |activation|, and where non-finite values
were seen without harm.

It feeds the step lines, the gradient-explosion check, the history table, the JSON report and the end-of-run
notes on module outputs / batch keys that held NaN or Inf (a deliberate -inf mask, a NaN that nanmean consumed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from debug_nan.checks.watch_result import MicroResult, larger

MAX_RUNS = 16  # step ranges kept per non-finite series; later steps are only counted (memory stays bounded)


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


@dataclass
class NonfiniteSeries:
    """The steps in which one module output or batch key held NaN/Inf: ranges of steps, at most MAX_RUNS."""

    where: str  # "output" | "batch key"
    name: str
    held: set[str] = field(default_factory=set)  # "nan", "+inf", "-inf"
    runs: list[list[int]] = field(default_factory=list)  # [first, last] step ranges, in order
    steps: int = 0  # how many steps, also those past MAX_RUNS ranges
    last: int = 0
    harmed: list[int] = field(default_factory=list)  # steps in which harm followed (at most MAX_RUNS)

    def add(self, step: int, what: str) -> None:
        self.held.update(what.split())
        if step == self.last:
            return
        self.steps += 1
        self.last = step
        if self.runs and self.runs[-1][1] == step - 1:
            self.runs[-1][1] = step
        elif len(self.runs) < MAX_RUNS:
            self.runs.append([step, step])

    def describe_steps(self, first: int, last: int) -> str:
        if self.runs == [[first, last]] and self.steps == last - first + 1:
            return f"in every step ({first}..{last})" if last > first else f"in step {first}"
        shown = ", ".join(f"{a}..{b}" if b > a else str(a) for a, b in self.runs)
        covered = sum(b - a + 1 for a, b in self.runs)
        more = f", and {self.steps - covered} later step(s) up to {self.last}" if self.steps > covered else ""
        return f"in step{'s' if self.steps > 1 else ''} {shown}{more}"


class History:
    def __init__(self):
        self.steps: list[StepRecord] = []
        self.nonfinite: dict[tuple[str, str], NonfiniteSeries] = {}  # (where, name) -> series, first seen first

    def begin(self, step: int) -> StepRecord:
        rec = StepRecord(step)
        self.steps.append(rec)
        return rec

    def add_micro(self, rec: StepRecord, result: MicroResult, last: bool) -> None:
        rec.micro_batches += 1
        outputs = result.values("forward")
        if not rec.activations:
            rec.activations = outputs
        else:
            for name, value in outputs.items():
                rec.activations[name] = larger(rec.activations.get(name), value)
        loss = result.loss()
        if loss is not None:
            rec.loss = loss if rec.loss is None else rec.loss + loss
        for name, value in result.values("loss_part").items():
            rec.parts[name] = rec.parts.get(name, 0.0) + value
        for where, kind in (("batch key", "data"), ("output", "forward")):
            for check in result.nonfinite(kind):
                series = self.nonfinite.setdefault((where, check.name), NonfiniteSeries(where, check.name))
                series.add(rec.step, check.nonfinite)
        if result.harm() is not None:  # rare: mark the series seen in this step
            for series in self.nonfinite.values():
                if series.last == rec.step and rec.step not in series.harmed and len(series.harmed) < MAX_RUNS:
                    series.harmed.append(rec.step)
        if last:
            grads = result.values("grad")
            rec.grad_norms = grads
            if grads:
                rec.grad_norm = math.sqrt(sum(v * v for v in grads.values()))

    def nonfinite_notes(self) -> list[str]:
        """One line per module output / batch key that held NaN or Inf, e.g. "`block.bias` output holds -inf in
        every step (1..10); it never reached the loss, a gradient or a parameter"."""
        if not self.steps:
            return []
        first, last = self.steps[0].step, self.steps[-1].step
        notes = []
        for series in self.nonfinite.values():
            held = " and ".join(k for k in ("nan", "+inf", "-inf") if k in series.held)
            line = (f"`{series.name or '<model>'}` {series.where} holds {held.replace('nan', 'NaN')} "
                    f"{series.describe_steps(first, last)}")
            if series.harmed:
                line += (f"; in step {', '.join(map(str, series.harmed))} the loss, a gradient or a parameter also "
                         f"went non-finite (see the finding)")
            else:
                line += "; it never reached the loss, a gradient or a parameter"
            notes.append(line)
        return notes

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
