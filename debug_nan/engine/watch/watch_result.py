"""The host-side view of one watched micro-batch: what was measured, what held non-finite values, what was harm.

A micro-batch's values arrive from the device as one float64 vector and stay as NumPy arrays, one Segment per
check kind, in execution order; Check objects are built only for the few values someone asks about.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from debug_nan.engine.vocabulary import CheckKind

# execution order within a micro-batch: the parameter check of the previous update is read first; buffers (written
# by the forward: running statistics, EMA codebooks) are read last
KIND_ORDER = (CheckKind.PARAM, CheckKind.DATA, CheckKind.FORWARD, CheckKind.LOSS, CheckKind.LOSS_PART, CheckKind.GRAD,
              CheckKind.BUFFER)
# a non-finite value of these kinds is harm, and trips the micro-batch
HARM_KINDS = frozenset({CheckKind.PARAM, CheckKind.LOSS, CheckKind.LOSS_PART, CheckKind.GRAD})


def larger(a: float | None, b: float) -> float:
    """max(a, b) where NaN wins and sticks, and None is nothing yet."""
    if a is None or b != b:
        return b
    return a if a != a or a >= b else b


_UNNAMED = {CheckKind.DATA: "<batch>", CheckKind.FORWARD: "<model>"}


@dataclass
class Check:
    kind: CheckKind  # (see Segment.value)
    name: str  # parameter name ("w (optimizer exp_avg)" for a state), batch key, module path, loss part
    value: float
    nonfinite: str = ""  # "" when finite, else what it held: "nan", "inf" (sign unknown), "+inf", "-inf", "+inf -inf"

    def __post_init__(self):
        self.kind = CheckKind(self.kind)  # a check read back from a bundle or built from a word: an unknown one fails

    def to_dict(self) -> dict:
        """Plain data (a repro bundle's `check`): the kind as its word."""
        return {"kind": self.kind.value, "name": self.name, "value": self.value, "nonfinite": self.nonfinite}

    @property
    def label(self) -> str:
        """The name as the log shows it; an unnamed check is the loss, the batch itself (a lone tensor) or the root
        model."""
        return self.name or _UNNAMED.get(self.kind, "<loss>")

    def said(self) -> str:
        """What it read, in words: "loss `<loss>` = nan"."""
        return f"{self.kind} `{self.label}` = {self.value}"


@dataclass
class Segment:
    """One kind's values, in the order they were recorded ([n] each).

    value: max |x| (data, forward), the value itself (loss, loss_part), the L2 norm (buffer: accumulated in
    float64, so it is non-finite exactly when an element is, for buffers narrower than float64; grad: a NaN/Inf
    element makes the norm NaN/Inf), param: a norm or, for large CPU tensors, a sum (norms.state_sums). A norm or
    sum that overflowed while every element was finite is cleared by a second look at max |x|, so `nonfinite` is
    exact. lo/hi: min and max (data, forward only), which tell -Inf from +Inf."""

    kind: CheckKind
    names: list[str]
    value: np.ndarray
    nonfinite: np.ndarray  # bool
    lo: np.ndarray | None = None
    hi: np.ndarray | None = None

    def what(self, i: int) -> str:
        """What value i held: "" when finite, else "nan", "inf", "+inf", "-inf" or "+inf -inf"."""
        if not self.nonfinite[i]:
            return ""
        if self.lo is not None:
            lo, hi = self.lo[i], self.hi[i]
            if math.isnan(lo) or math.isnan(hi):
                return "nan"
            return " ".join(s for s, hit in (("+inf", hi == math.inf or lo == math.inf),
                                              ("-inf", lo == -math.inf or hi == -math.inf)) if hit)
        v = self.value[i]
        if math.isnan(v):
            return "nan"
        if self.kind in (CheckKind.LOSS, CheckKind.LOSS_PART):
            return "+inf" if v > 0 else "-inf"
        return "inf"

    def check(self, i: int) -> Check:
        return Check(self.kind, self.names[i], float(self.value[i]), self.what(i))

    def first_nonfinite(self) -> Check | None:
        hits = np.flatnonzero(self.nonfinite)
        return self.check(int(hits[0])) if hits.size else None


@dataclass
class MicroResult:
    """One micro-batch's checks: one Segment per kind present, in KIND_ORDER."""

    segments: list[Segment]
    layer_stats: dict[str, object] = field(default_factory=dict)  # filled only in trace-every-step mode
    rank_codes: list[float] | None = None  # under DDP: every rank's earliest harm phase code (0 = clean)
    # buffers that were finite at the previous sync (or when the watch began) and hold NaN/Inf now: not harm by
    # itself (a buffer may never reach the loss), but the step that wrote it is the one to replay
    new_nonfinite_buffers: list[Check] = field(default_factory=list)

    def segment(self, kind: str) -> Segment | None:
        return next((s for s in self.segments if s.kind == kind), None)

    def harm(self) -> Check | None:
        """The earliest check of a harm kind (loss, loss part, gradient, parameter/state) that went non-finite."""
        for seg in self.segments:
            if seg.kind in HARM_KINDS:
                hit = seg.first_nonfinite()
                if hit is not None:
                    return hit
        return None

    def first_harm(self) -> Check | None:
        """The check that trips this micro-batch, None when nothing harmful went non-finite.

        A non-finite parameter or optimizer state (the previous update) comes first. Otherwise, when the batch
        itself held NaN/Inf, its earliest such key stands for the harm: the batch is the earliest possible origin
        and the replay has no operation to name for it. Non-finite module outputs alone never trip."""
        harm = self.harm()
        if harm is None or harm.kind == CheckKind.PARAM:
            return harm
        data = self.segment(CheckKind.DATA)
        return (data.first_nonfinite() if data is not None else None) or harm

    def nonfinite(self, kind: str) -> list[Check]:
        """Every non-finite check of one kind (e.g. module outputs holding a deliberate -inf), in order."""
        seg = self.segment(kind)
        return [seg.check(int(i)) for i in np.flatnonzero(seg.nonfinite)] if seg is not None else []

    def values(self, kind: str) -> dict[str, float]:
        """name -> value for one kind; repeated names (a module called twice) keep the largest, NaN first."""
        seg = self.segment(kind)
        if seg is None:
            return {}
        out = dict(zip(seg.names, seg.value.tolist()))
        if len(out) < len(seg.names):  # a module called more than once: merge its values
            out = {}
            for name, value in zip(seg.names, seg.value.tolist()):
                out[name] = larger(out.get(name), value)
        return out

    @property
    def checks(self) -> list[Check]:
        """Every check as a Check, in execution order (slow: for tests and debugging, not the hot path)."""
        return [seg.check(i) for seg in self.segments for i in range(len(seg.names))]

    def loss(self) -> float | None:
        seg = self.segment(CheckKind.LOSS)
        return float(seg.value[0]) if seg is not None and len(seg.names) else None
