"""TensorStats: one tensor's statistics as plain numbers (a finding's evidence, the summary's lines), measured by
stats.py `tensor_stats`. No torch: the top process of `debug-nan run -- PROGRAM` renders its ranks' evidence
without importing it."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass


@dataclass
class TensorStats:
    shape: list[int]
    dtype: str
    numel: int
    nan: int
    posinf: int
    neginf: int
    min: float | None  # over finite values
    max: float | None
    mean: float | None
    std: float | None
    absmax: float | None
    headroom: float | None  # dtype max / largest finite |x| (how far from overflow); None: integer dtype or all 0

    @property
    def nonfinite(self) -> int:
        return self.nan + self.posinf + self.neginf

    def to_dict(self) -> dict:
        return asdict(self)

    def line(self) -> str:
        """shape, dtype, min/max/mean/std over finite values, NaN/Inf counts with percentages, headroom."""
        def pct(n: int) -> str:
            return f"{n} ({100.0 * n / max(self.numel, 1):.2f}%)"

        parts = [f"{self.shape} {self.dtype}"]
        if self.min is not None:
            parts.append(f"min {self.min:.4g} max {self.max:.4g}")
        if self.mean is not None:
            parts.append(f"mean {self.mean:.4g} std {self.std:.4g}")
        parts.append(f"NaN {pct(self.nan)} +Inf {pct(self.posinf)} -Inf {pct(self.neginf)}")
        if self.headroom is not None:  # (a float64 tensor under 1 has more than a float holds: said as a bound)
            parts.append(f"headroom {self.headroom:.3g}x" if math.isfinite(self.headroom) else "headroom >1e308x")
        return ", ".join(parts)
