"""Tier 1, the watch: always on and cheap.

Per micro-batch it records, ON THE DEVICE, one number per check: max |x| of every floating batch tensor and of
every module output (a forward hook; from one `aminmax` reduction), the loss, the L2 norm of every gradient, and
(after an optimizer step) max |x| of every parameter and optimizer state tensor. A value is non-finite exactly
when its tensor holds a NaN or Inf (min/max and norms propagate both), so the same number is both the finiteness
flag and the history. All values are stacked (one stack per dtype) and copied to the host once per micro-batch:
one device sync, none per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from debug_nan.checks.stats import flat_tensors, tensor_stats

INF = float("inf")


def min_max(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """0-d (min, max) of t on its device, one reduction (aminmax: ~20x faster on CPU than an inf-norm); both NaN
    if t holds a NaN. max |t| = max(-min, max) is formed on the host."""
    t = t.detach()
    if t.numel() == 0:
        zero = t.new_zeros(())
        return zero, zero
    return torch.aminmax(t)


def _combine(lo: float, hi: float) -> float:
    if math.isnan(lo) or math.isnan(hi):
        return math.nan
    return max(-lo, hi)


@dataclass
class Check:
    kind: str  # "param" | "data" | "forward" | "loss" | "loss_part" | "grad" (max |g|) | "grad_norm" (L2)
    name: str  # parameter name, batch key, module path
    value: float


@dataclass
class MicroResult:
    """The host-side view of one micro-batch's checks, in execution order."""

    checks: list[Check]
    layer_stats: dict[str, object] = field(default_factory=dict)  # filled only in trace-every-step mode
    rank_codes: list[float] | None = None  # under DDP: every rank's earliest non-finite phase code (0 = clean)

    def first_nonfinite(self) -> Check | None:
        """The earliest check whose tensor held a NaN/Inf (gradient L2 norms only feed the history: a norm can
        overflow while every element is finite; the gradients' own check is their max |x|)."""
        return next((c for c in self.checks if c.kind != "grad_norm" and not math.isfinite(c.value)), None)

    def values(self, kind: str) -> dict[str, float]:
        """name -> value for one kind; repeated names (a module called twice) keep the largest."""
        out: dict[str, float] = {}
        for c in self.checks:
            if c.kind == kind:
                prev = out.get(c.name)
                out[c.name] = c.value if prev is None or not (c.value <= prev) else prev
        return out

    def loss(self) -> float | None:
        return next((c.value for c in self.checks if c.kind == "loss"), None)


def param_and_state_tensors(named_params, optimizer) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) for every parameter and every floating optimizer state tensor ("w (optimizer exp_avg)")."""
    out = []
    for name, p in named_params:
        out.append((name, p.detach()))
        state = optimizer.state.get(p, {}) if optimizer is not None else {}
        for key, value in state.items():
            if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() > 0:
                out.append((f"{name} (optimizer {key})", value.detach()))
    return out


class Watch:
    """Forward hooks on every module of `model` plus explicit calls for batch, loss, gradients and parameters."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None):
        self.model = model
        self.optimizer = optimizer
        self.module_names = {m: n for n, m in model.named_modules()}
        self.named_params = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
        self.enabled = True
        self.detailed = False  # trace-every-step: full statistics per module output (syncs per layer)
        self._values: list[torch.Tensor] = []
        self._labels: list[tuple[str, str, int]] = []  # (kind, name, number of values: 1, or 2 for min/max)
        self._layer_stats: dict[str, object] = {}
        self._handles = [m.register_forward_hook(self._on_output) for m in self.module_names]

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _add(self, kind: str, name: str, *values: torch.Tensor) -> None:
        self._values.extend(values)
        self._labels.append((kind, name, len(values)))

    def _on_output(self, module: nn.Module, inputs, output) -> None:
        if not self.enabled:
            return
        name = self.module_names[module]
        for _, t in flat_tensors(output):
            if t.is_floating_point():
                self._add("forward", name, *min_max(t))
                if self.detailed:
                    self._layer_stats[f"{name or '<model>'} ({type(module).__name__})"] = tensor_stats(t)
                break  # the first floating output stands for the module

    def watch_batch(self, batch) -> None:
        for path, t in flat_tensors(batch):
            if t.is_floating_point():
                self._add("data", path, *min_max(t))

    def watch_loss(self, loss: torch.Tensor, parts: dict[str, torch.Tensor] | None = None) -> None:
        self._add("loss", "", loss.detach().reshape(()))
        for name, value in (parts or {}).items():
            self._add("loss_part", name, value.detach().reshape(()))

    def watch_grads(self) -> list[torch.Tensor] | None:
        """Per gradient: max |g| (the finiteness check; it cannot overflow) and the L2 norm (history, explosion
        check, and returned so that clipping reuses them), each one fused kernel per device and dtype."""
        named = [(n, p.grad) for n, p in self.named_params if p.grad is not None]
        if not named:
            return None
        for (name, _), peak in zip(named, torch._foreach_norm([g.detach() for _, g in named], INF)):
            self._add("grad", name, peak)
        # fp32/fp64 gradients in one fused kernel; a norm of fp16/bf16 gradients (a model cast to half) would
        # overflow in its own dtype, so those are reduced in fp32
        wide = [i for i, (_, g) in enumerate(named) if g.dtype in (torch.float32, torch.float64)]
        norms: list[torch.Tensor | None] = [None] * len(named)
        for i, norm in zip(wide, torch._foreach_norm([named[i][1].detach() for i in wide]) if wide else []):
            norms[i] = norm
        for i, (_, g) in enumerate(named):
            if norms[i] is None:
                norms[i] = torch.linalg.vector_norm(g.detach(), dtype=torch.float32)
        for (name, _), norm in zip(named, norms):
            self._add("grad_norm", name, norm)
        return norms

    def watch_params(self) -> None:
        """After an optimizer step: max |x| of every parameter and optimizer state tensor."""
        named = param_and_state_tensors(self.named_params, self.optimizer)
        if named:
            for (name, _), norm in zip(named, torch._foreach_norm([t for _, t in named], INF)):
                self._add("param", name, norm)

    def sync(self, dist_ctx=None, raised: bool = False, abort: bool = False) -> MicroResult:
        """Copy this micro-batch's values to the host (the one sync) and start a new micro-batch. Under DDP the
        ranks' phase codes are all-reduced on the device first and come back in the same copy."""
        values, codes = self._gather(dist_ctx, raised, abort)
        checks, i = [], 0
        for kind, name, width in self._labels:
            value = float(values[i]) if width == 1 else _combine(float(values[i]), float(values[i + 1]))
            checks.append(Check(kind, name, value))
            i += width
        result = MicroResult(checks, self._layer_stats, codes)
        self._values, self._labels, self._layer_stats = [], [], {}
        return result

    def _gather(self, dist_ctx=None, raised: bool = False, abort: bool = False
                ) -> tuple[np.ndarray, list[float] | None]:
        """All recorded 0-d values as one float64 host array (one stack + cast per (device, dtype), one copy),
        and under DDP the all-reduced [world] phase codes riding in the same copy."""
        device = self._values[0].device if self._values else next(self.model.parameters()).device
        groups: dict[tuple, list[int]] = {}
        for i, v in enumerate(self._values):
            groups.setdefault((v.device, v.dtype), []).append(i)
        # float64 on the way: a float64 model's values above float32's range must not read as Inf
        parts = [torch.stack([self._values[i] for i in idx]).to(device, torch.float64) for idx in groups.values()]
        order = np.concatenate([np.asarray(idx, dtype=np.int64) for idx in groups.values()]) if groups else \
            np.zeros(0, dtype=np.int64)
        flat = torch.cat(parts) if parts else torch.zeros(0, device=device, dtype=torch.float64)
        n = flat.numel()
        if dist_ctx is not None:
            from debug_nan.train.distributed import ABORT_CODE, EXCEPTION_CODE, PHASE_CODE, agree

            weights = np.zeros(len(self._values), dtype=np.float32)
            i = 0
            for kind, _, width in self._labels:
                weights[i:i + width] = PHASE_CODE[kind]
                i += width
            w = torch.from_numpy(weights[order]).to(device, non_blocking=True)
            local = (~torch.isfinite(flat)).float().mul(w).amax() if n else torch.zeros((), device=device)
            if raised or abort:
                local = torch.clamp(local, min=float(ABORT_CODE if abort else EXCEPTION_CODE))
            flat = torch.cat([flat, agree(local, dist_ctx).double()])
        host = flat.cpu().numpy().astype(np.float64)  # the one host sync
        out = np.empty(len(self._values))
        out[order] = host[:n]
        return out, (host[n:].tolist() if dist_ctx is not None else None)

    def discard(self) -> None:
        self._values, self._labels, self._layer_stats = [], [], {}
