"""Per-step history from the watch: loss, gradient norms, per-layer max |activation|, and where non-finite values
were seen without harm.

It feeds the step lines, the gradient-explosion check, the history table, the JSON report and the end-of-run
notes on module outputs / batch keys that held NaN or Inf (a deliberate -inf mask, a NaN that nanmean consumed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from debug_nan.engine.vocabulary import CheckKind
from debug_nan.engine.watch.watch_result import MicroResult, larger

MAX_NOTES = 10  # outputs that never reached harm, listed one per line in the summary
MAX_RUNS = 16  # step ranges kept per non-finite series; later steps are only counted (memory stays bounded)
# per-layer values (max |activation| per module, gradient norm per parameter: most of a step's size) are kept for
# the last RECENT_STEPS steps and, before them, for at most SPARSE_STEPS steps on a stride that doubles as the run
# grows: memory and the JSON report stay bounded on long runs; every step's scalars are kept
RECENT_STEPS = 100
SPARSE_STEPS = 100


@dataclass
class StepRecord:
    step: int
    loss: float | None = None
    parts: dict[str, float] = field(default_factory=dict)
    grad_norm: float | None = None  # total L2 norm before clipping (accumulated over the step's micro-batches)
    grad_norms: dict[str, float] = field(default_factory=dict)
    activations: dict[str, float] = field(default_factory=dict)  # module -> max |output| over the micro-batches
    lr: float | None = None
    loss_scale: float | None = None  # the fp16 gradient scaler's scale in this step (None without one)
    seconds: float | None = None
    peak_memory_mb: float | None = None
    scaler_skipped: bool = False
    micro_batches: int = 0
    per_layer: bool = True  # False: its per-layer values were dropped (see RECENT_STEPS)
    outputs_measured: bool = True  # False: the watch left its module outputs out (engine/session/output_schedule.py)

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
    in_runs: int = 0  # how many of them the ranges hold (a range can span steps whose outputs were not measured)
    last: int = 0
    harmed: list[int] = field(default_factory=list)  # steps in which harm followed (at most MAX_RUNS)

    def add(self, step: int, what: str, previous: int | None) -> None:
        """Seen in `step`; `previous`: the step checked before it (a run goes on when the series was seen there)."""
        self.held.update(what.split())
        if step == self.last:
            return
        self.steps += 1
        self.last = step
        if self.runs and self.runs[-1][1] == previous:
            self.runs[-1][1] = step
        elif len(self.runs) < MAX_RUNS:
            self.runs.append([step, step])
        else:
            return
        self.in_runs += 1

    def describe_steps(self, first: int, last: int, checked: int | None = None) -> str:
        """`first`..`last`: the steps checked; `checked`: how many of them (fewer than all: module outputs measured
        on a stride)."""
        checked = last - first + 1 if checked is None else checked
        strided = checked < last - first + 1
        if self.runs == [[first, last]] and self.steps == checked:
            if strided:
                return f"in every step whose outputs were measured ({checked} of steps {first}..{last})"
            return f"in every step ({first}..{last})" if last > first else f"in step {first}"
        shown = ", ".join(f"{a}..{b}" if b > a else str(a) for a, b in self.runs)
        more = f", and {self.steps - self.in_runs} later step(s) up to {self.last}" if self.steps > self.in_runs else ""
        measured = f" ({self.steps} of the {checked} steps whose outputs were measured)" if strided else ""
        return f"in step{'s' if self.steps > 1 else ''} {shown}{more}{measured}"


@dataclass
class MeasuredSteps:
    """The steps whose module outputs the watch measured (all of them unless engine/session/output_schedule.py thins
    them)."""

    count: int = 0
    first: int | None = None
    previous: int | None = None  # the one measured before `last`
    last: int | None = None

    def add(self, step: int) -> None:
        self.count += 1
        self.first = step if self.first is None else self.first
        self.previous, self.last = self.last, step


class History:
    def __init__(self):
        self.steps: list[StepRecord] = []
        self.nonfinite: dict[tuple[str, str], NonfiniteSeries] = {}  # (where, name) -> series, first seen first
        self.stride = 1  # older steps keep their per-layer values when step % stride == 0
        self._sparse = 0  # how many steps before the recent window still have them
        self.first_harm_step: int | None = None  # the first step whose loss, gradients or parameters went non-finite
        self.measured = MeasuredSteps()

    def begin(self, step: int, outputs_measured: bool = True) -> StepRecord:
        rec = StepRecord(step, outputs_measured=outputs_measured)
        if outputs_measured:
            self.measured.add(step)
        self.steps.append(rec)
        if len(self.steps) > RECENT_STEPS:
            self._thin(self.steps[-RECENT_STEPS - 1])
        return rec

    def _thin(self, leaving: StepRecord) -> None:
        """A step leaves the recent window: keep its per-layer values only on the stride (doubled, and the older
        steps thinned to it, when more than SPARSE_STEPS would be kept)."""
        if leaving.step % self.stride:
            self._drop(leaving)
            return
        self._sparse += 1
        if self._sparse > SPARSE_STEPS:
            self.stride *= 2
            for rec in self.steps[:-RECENT_STEPS]:
                if rec.per_layer and rec.step % self.stride:
                    self._drop(rec)
                    self._sparse -= 1

    @staticmethod
    def _drop(rec: StepRecord) -> None:
        rec.activations, rec.grad_norms, rec.per_layer = {}, {}, False

    def kept(self) -> str:
        """What the history holds, in words (for the JSON report)."""
        thinned = "" if self.measured.count >= len(self.steps) else \
            f"; module outputs (max_abs_activation) measured in {self.measured.count} of the {len(self.steps)} steps"
        if all(r.per_layer for r in self.steps):
            return "every step's values, per layer too" + thinned
        return (f"every step's loss, gradient norm, lr, time and memory; per-layer values (max_abs_activation, "
                f"grad_norms) for the last {RECENT_STEPS} steps and every {self.stride}th step before them{thinned}")

    def add_micro(self, rec: StepRecord, result: MicroResult, last: bool) -> None:
        rec.micro_batches += 1
        outputs = result.values(CheckKind.FORWARD)
        if not rec.activations:
            rec.activations = outputs
        else:
            for name, value in outputs.items():
                rec.activations[name] = larger(rec.activations.get(name), value)
        loss = result.loss()
        if loss is not None:
            rec.loss = loss if rec.loss is None else rec.loss + loss
        for name, value in result.values(CheckKind.LOSS_PART).items():
            rec.parts[name] = rec.parts.get(name, 0.0) + value
        # a series goes on from the step checked before: the last step for a batch key, the last step whose
        # outputs were measured for a module output
        for where, kind, previous in (("batch key", CheckKind.DATA, rec.step - 1),
                                      ("output", CheckKind.FORWARD, self.measured.previous)):
            for check in result.nonfinite(kind):
                series = self.nonfinite.setdefault((where, check.name), NonfiniteSeries(where, check.name))
                series.add(rec.step, check.nonfinite, previous)
        if result.harm() is not None:  # rare: mark the series seen in this step
            if self.first_harm_step is None:
                self.first_harm_step = rec.step
            for series in self.nonfinite.values():
                if series.last == rec.step and rec.step not in series.harmed and len(series.harmed) < MAX_RUNS:
                    series.harmed.append(rec.step)
        if last:
            self.step_gradients(rec, result)

    @staticmethod
    def step_gradients(rec: StepRecord, result: MicroResult | None) -> None:
        """The step's gradient norms: those read after its last micro-batch (accumulated over the step)."""
        seg = result.segment(CheckKind.GRAD) if result is not None else None
        rec.grad_norms = result.values(CheckKind.GRAD) if seg is not None else {}
        if seg is not None and len(seg.value):
            rec.grad_norm = float(np.sqrt(np.dot(seg.value, seg.value)))

    def nonfinite_notes(self) -> list[str]:
        """One line per module output / batch key that held NaN or Inf, e.g. "`block.bias` output holds -inf in
        every step (1..10); it never reached the loss, a gradient or a parameter"."""
        if not self.steps:
            return []
        first, last = self.steps[0].step, self.steps[-1].step
        quiet, harmed = [], []
        m = self.measured
        for series in self.nonfinite.values():
            held = " and ".join(k for k in ("nan", "+inf", "-inf") if k in series.held)
            span = (m.first, m.last, m.count) if series.where == "output" and m.count else (first, last)
            line = (f"`{series.name or '<model>'}` {series.where} holds {held.replace('nan', 'NaN')} "
                    f"{series.describe_steps(*span)}")
            if series.harmed:
                harmed.append((series, line + f"; in step {', '.join(map(str, series.harmed))} the loss, a gradient "
                                              f"or a parameter also went non-finite (see the finding)"))
            elif self.first_harm_step is not None and self.first_harm_step > series.runs[0][0]:
                # harm came in a later step: a value kept in state (a buffer) may have carried it there
                quiet.append(line + f"; the loss, gradients and parameters stayed finite in those steps (harm came "
                                    f"at step {self.first_harm_step}: see the finding)")
            else:
                quiet.append(line + "; it never reached the loss, a gradient or a parameter")
        notes = quiet[:MAX_NOTES] + ([f"... and {len(quiet) - MAX_NOTES} more outputs like these"]
                                     if len(quiet) > MAX_NOTES else [])
        if len(harmed) <= 3:
            notes += [line for _, line in harmed]
        else:  # downstream of a finding, NaN spreads through every later module: one line, not one per module
            names = ", ".join(f"`{series.name or '<model>'}`" for series, _ in harmed[:3])
            notes.append(f"{len(harmed)} module outputs / batch keys held NaN/Inf in the step(s) of the finding "
                         f"(downstream of it), e.g. {names}")
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
        """One dict per step; `max_abs_activation` and `grad_norms` only for the steps that kept them."""
        return [{"step": r.step, "loss": r.loss, "parts": r.parts, "grad_norm": r.grad_norm, "lr": r.lr,
                 **({"loss_scale": r.loss_scale} if r.loss_scale is not None else {}),
                 "seconds": r.seconds, "peak_memory_mb": r.peak_memory_mb, "scaler_skipped": r.scaler_skipped,
                 **({} if r.outputs_measured else {"outputs_measured": False}),
                 **({"max_abs_activation": r.activations, "grad_norms": r.grad_norms} if r.per_layer else {})}
                for r in self.steps]

    @classmethod
    def from_dict(cls, steps: list[dict]) -> History:
        """The steps of `to_dict` read back (the history of another process: a rank of `debug-nan run -- PROGRAM`
        left its report for the top process to present)."""
        history = cls()
        for d in steps:
            rec = StepRecord(d["step"], loss=d.get("loss"), parts=dict(d.get("parts") or {}),
                             grad_norm=d.get("grad_norm"), grad_norms=dict(d.get("grad_norms") or {}),
                             activations=dict(d.get("max_abs_activation") or {}), lr=d.get("lr"),
                             loss_scale=d.get("loss_scale"), seconds=d.get("seconds"),
                             peak_memory_mb=d.get("peak_memory_mb"), scaler_skipped=bool(d.get("scaler_skipped")),
                             per_layer="max_abs_activation" in d, outputs_measured=d.get("outputs_measured", True))
            if rec.outputs_measured:
                history.measured.add(rec.step)
            history.steps.append(rec)
        return history
