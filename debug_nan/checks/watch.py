"""Tier 1, the watch: always on and cheap.

Per micro-batch it records, ON THE DEVICE, one float per check: the max |x| of every floating batch tensor, of
every module output (a forward hook), of the loss, the L2 norm of every gradient, and (after an optimizer step)
the max |x| of every parameter and optimizer state tensor. A value is non-finite exactly when its tensor holds a
NaN or Inf (max and norm propagate both), so the same number is both the finiteness flag and the history. All
values are stacked and copied to the host once per micro-batch: one device sync, none per layer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from debug_nan.checks.stats import flat_tensors, tensor_stats

INF = float("inf")


def max_abs(t: torch.Tensor) -> torch.Tensor:
    """0-d float32 max |t| on t's device; NaN if t holds a NaN, inf if it holds an Inf (no host sync)."""
    return torch.linalg.vector_norm(t.detach(), INF, dtype=torch.float32)


@dataclass
class Check:
    kind: str  # "param" | "data" | "forward" | "loss" | "loss_part" | "grad"
    name: str  # parameter name, batch key, module path
    value: float


@dataclass
class MicroResult:
    """The host-side view of one micro-batch's checks, in execution order."""

    checks: list[Check]
    layer_stats: dict[str, object] = field(default_factory=dict)  # filled only in trace-every-step mode

    def first_nonfinite(self) -> Check | None:
        return next((c for c in self.checks if not math.isfinite(c.value)), None)

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
        self._labels: list[tuple[str, str]] = []
        self._layer_stats: dict[str, object] = {}
        self._handles = [m.register_forward_hook(self._on_output) for m in self.module_names]

    def close(self) -> None:
        for h in self._handles:
            h.remove()
        self._handles = []

    def _add(self, kind: str, name: str, value: torch.Tensor) -> None:
        self._values.append(value)
        self._labels.append((kind, name))

    def _on_output(self, module: nn.Module, inputs, output) -> None:
        if not self.enabled:
            return
        name = self.module_names[module]
        for _, t in flat_tensors(output):
            if t.is_floating_point():
                self._add("forward", name, max_abs(t))
                if self.detailed:
                    self._layer_stats[f"{name or '<model>'} ({type(module).__name__})"] = tensor_stats(t)
                break  # the first floating output stands for the module

    def watch_batch(self, batch) -> None:
        for path, t in flat_tensors(batch):
            if t.is_floating_point():
                self._add("data", path, max_abs(t))

    def watch_loss(self, loss: torch.Tensor, parts: dict[str, torch.Tensor] | None = None) -> None:
        self._add("loss", "", loss.detach().float().reshape(()))
        for name, value in (parts or {}).items():
            self._add("loss_part", name, value.detach().float().reshape(()))

    def watch_grads(self) -> list[torch.Tensor] | None:
        """L2 norm of every gradient, computed together (one fused kernel per device and dtype); returned too,
        so that clipping reuses them."""
        named = [(n, p.grad) for n, p in self.named_params if p.grad is not None]
        if not named:
            return None
        norms = torch._foreach_norm([g.detach() for _, g in named])
        for (name, _), norm in zip(named, norms):
            self._add("grad", name, norm.float())
        return list(norms)

    def watch_params(self) -> None:
        """After an optimizer step: max |x| of every parameter and optimizer state tensor."""
        tensors, names = [], []
        for name, p in self.named_params:
            tensors.append(p.detach())
            names.append(name)
            state = self.optimizer.state.get(p, {}) if self.optimizer is not None else {}
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dim() > 0:
                    tensors.append(value.detach())
                    names.append(f"{name} (optimizer {key})")
        if tensors:
            for name, norm in zip(names, torch._foreach_norm(tensors, INF)):
                self._add("param", name, norm.float())

    def sync(self) -> MicroResult:
        """Copy this micro-batch's values to the host (the one sync) and start a new micro-batch."""
        if self._values:
            values = torch.stack([v.to(self._values[0].device) for v in self._values]).cpu().numpy()
        else:
            values = np.zeros(0, dtype=np.float32)
        checks = [Check(kind, name, float(v)) for (kind, name), v in zip(self._labels, values)]
        result = MicroResult(checks, self._layer_stats)
        self._values, self._labels, self._layer_stats = [], [], {}
        return result

    def discard(self) -> None:
        self._values, self._labels, self._layer_stats = [], [], {}
