"""Tensor statistics for logs and evidence: one helper, safe for integer tensors and non-finite values."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch


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
        if self.headroom is not None:
            parts.append(f"headroom {self.headroom:.3g}x")
        return ", ".join(parts)


def tensor_stats(t: torch.Tensor) -> TensorStats:
    """Statistics of one tensor (syncs with the device: use only off the hot path)."""
    t = t.detach()
    shape, dtype, numel = list(t.shape), str(t.dtype).replace("torch.", ""), t.numel()
    if t.dtype == torch.bool:
        t = t.to(torch.uint8)
    if not t.is_floating_point() and not t.is_complex():
        if numel == 0:
            return TensorStats(shape, dtype, 0, 0, 0, 0, None, None, None, None, None, None)
        mn, mx = int(t.min()), int(t.max())
        return TensorStats(shape, dtype, numel, 0, 0, 0, mn, mx, None, None, float(max(abs(mn), abs(mx))), None)
    x = t if t.dtype == torch.float64 else t.float()  # (float64 beyond float32's range stays finite)
    nan = int(torch.isnan(x).sum())
    posinf = int(torch.isposinf(x).sum())
    neginf = int(torch.isneginf(x).sum())
    finite = x[torch.isfinite(x)]
    if finite.numel() == 0:
        return TensorStats(shape, dtype, numel, nan, posinf, neginf, None, None, None, None, None, None)
    absmax = float(finite.abs().max())
    headroom = float(torch.finfo(t.dtype).max) / absmax if absmax > 0 else None  # all zero: no `headroom infx`
    std = float(finite.double().std()) if finite.numel() > 1 else 0.0
    return TensorStats(shape, dtype, numel, nan, posinf, neginf, float(finite.min()), float(finite.max()),
                       float(finite.double().mean()), std, absmax, headroom)


def flat_tensors(obj, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """(path, tensor) for every tensor inside nested dicts/tuples/lists; other values are skipped."""
    if isinstance(obj, torch.Tensor):
        return [(prefix, obj)]
    out: list[tuple[str, torch.Tensor]] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += flat_tensors(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            out += flat_tensors(v, f"{prefix}[{i}]")
    return out


def move_to(obj, device: torch.device, copy: bool = False):
    """Every tensor in a nested batch on `device` (non_blocking); other values pass through. With copy=True
    every tensor is a fresh copy even where it is already on `device` (a replay must not share storage with
    anything user code may change in place)."""
    if isinstance(obj, torch.Tensor):
        return obj.to(device, non_blocking=True, copy=copy)
    if isinstance(obj, dict):
        return {k: move_to(v, device, copy) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(move_to(v, device, copy) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(move_to(v, device, copy) for v in obj)
    return obj


def capture_batch(obj, device: torch.device):
    """The batch as produced, safe from in-place changes by user code: tensors already on `device` (which the
    run would hand to user code as they are) are cloned; the others are kept, since the run only ever gives user
    code a copy of them on `device`."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone() if _may_alias(obj.device, device) else obj
    if isinstance(obj, dict):
        return {k: capture_batch(v, device) for k, v in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(capture_batch(v, device) for v in obj))
    if isinstance(obj, (list, tuple)):
        return type(obj)(capture_batch(v, device) for v in obj)
    return obj


def _may_alias(a: torch.device, b: torch.device) -> bool:
    """Whether .to(b) may return a tensor on `a` itself (a device without an index may be the current one)."""
    return a.type == b.type and (a.index == b.index or a.index is None or b.index is None)


def nonfinite_names(named: list[tuple[str, torch.Tensor]]) -> set[str]:
    """The names whose tensor holds a NaN/Inf (one host sync for all; a replay's, never the watch's hot path)."""
    if not named:
        return set()
    flags = torch.stack([~torch.isfinite(t).all() for _, t in named]).tolist()
    return {name for (name, _), bad in zip(named, flags) if bad}
