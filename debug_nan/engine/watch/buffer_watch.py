"""The watch's buffer check: which floating buffers of the model (BatchNorm running statistics, an EMA codebook,
a running normaliser) went from finite to non-finite since the previous sync.

A non-finite buffer is not harm by itself (a causal -inf mask is one by design, and a buffer may never reach the
loss), but a buffer that BECOMES non-finite was written by some op of this micro-batch: the driver replays it
then, while its snapshot still exists, so that harm in a later step (or in the eval pass) can name that op.

Cost: one fused `_foreach_norm` over the buffers per micro-batch, accumulated in float64 (so the norm of a
float32/fp16/bf16 buffer is non-finite exactly when an element is: no second look), read in the watch's one sync.
The buffers are looked up in their modules' `_buffers` at each sync: a buffer the user re-assigns is still seen.
The finiteness when the watch began is measured at construction and read at the first sync (no extra sync).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from debug_nan.engine.vocabulary import CheckKind
from debug_nan.engine.watch.watch_result import Check, Segment


def _floating(t) -> bool:
    return isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex()) and t.numel() > 0


class BufferWatch:
    def __init__(self, model: nn.Module):
        self._slots = [(m, key, f"{name}.{key}" if name else key) for name, m in model.named_modules()
                       for key in m._buffers]  # buffers by slot: a re-assigned one is followed
        self._previous: dict[str, bool] | None = None  # name -> non-finite at the previous sync
        self._start = self._norms()  # (names, device norms) when the watch began: read at the first sync

    def __bool__(self) -> bool:
        return bool(self._slots)

    def _norms(self) -> tuple[list[str], list[torch.Tensor]]:
        named = [(name, m._buffers[key]) for m, key, name in self._slots if _floating(m._buffers[key])]
        if not named:
            return [], []
        with torch.no_grad():
            norms = torch._foreach_norm([t.detach() for _, t in named], 2, dtype=torch.float64)
        return [n for n, _ in named], list(norms)

    def record(self) -> list[tuple[str, list[str], list[torch.Tensor]]]:
        """[(kind, names, 0-d norms)] to add to this sync: the buffers now and, at the first sync, at the start."""
        names, norms = self._norms()
        parts = [(CheckKind.BUFFER, names, norms)] if names else []
        if self._previous is None and self._start[0]:
            parts.append(("buffer_start", *self._start))
        return parts

    def settle(self, segments: list[Segment]) -> list[Check]:
        """The buffers that are non-finite in this sync's `buffer` segment and were finite at the previous sync
        (at the first: when the watch began). Removes the `buffer_start` segment from `segments`."""
        start = next((s for s in segments if s.kind == "buffer_start"), None)
        if start is not None:
            segments.remove(start)
            self._previous = dict(zip(start.names, start.nonfinite.tolist()))
        previous = self._previous or {}
        now = next((s for s in segments if s.kind == CheckKind.BUFFER), None)
        if now is None:
            return []
        hits = [int(i) for i in np.flatnonzero(now.nonfinite) if not previous.get(now.names[int(i)], False)]
        self._previous = dict(zip(now.names, now.nonfinite.tolist()))
        return [now.check(i) for i in hits]
