"""Which dataset records a batch holds, where the DataLoader's sampler says it: a data finding names the dataset's
index (record 881), not the batch row (#0).

`debug-nan run` wraps torch's DataLoader iterator (`sampling(iterator class)`): each index list the sampler hands
out is queued on its iterator, and each batch the iterator yields is remembered with its list (the shape, dtype and
first values of its tensors), the last KEPT of them. At a finding, `dataset_indices(batch)` returns the list of the
remembered batch that holds one of the finding's batch tensors, the same first values of the same shape (a batch
the script moved to the device or took one key of is still found; one it changed is not, and then no index is
claimed). Map-style datasets only (an IterableDataset has no
indices), loaders that yield in order (`in_order=False` pairs lists and batches otherwise).
"""

from __future__ import annotations

import functools
from collections import deque

import torch

from debug_nan.engine.stats import flat_tensors

KEPT = 8
PRINT = 4096  # values of each batch tensor kept to find it again (the whole of a small batch)
_QUEUE = "_debug_nan_indices"
_yielded: deque = deque(maxlen=KEPT)  # (dataset indices, _print of each of the batch's tensors)


def forget_batches() -> None:
    """(a new run in this process)"""
    _yielded.clear()


def sampling(owner) -> dict:
    """{name: wrapper} for `owner`'s (torch.utils.data.dataloader._BaseDataLoaderIter) `_next_index`, `__next__`
    and `_reset`: the originals are called unchanged."""
    next_index, next_batch, reset = owner._next_index, owner.__next__, owner._reset

    @functools.wraps(next_index)
    def _next_index(it):
        index = next_index(it)
        if _in_order_map_style(it):
            it.__dict__.setdefault(_QUEUE, deque()).append(index)
        return index

    @functools.wraps(next_batch)
    def __next__(it):
        batch = next_batch(it)
        queue = it.__dict__.get(_QUEUE)
        if queue:
            index = queue.popleft()
            indices = [index] if isinstance(index, int) else list(index) if isinstance(index, (list, tuple)) else []
            if indices and all(isinstance(i, int) for i in indices):
                _yielded.append((indices, [_print(t) for _, t in flat_tensors(batch) if t.numel()]))
        return batch

    @functools.wraps(reset)
    def _reset(it, *args, **kwargs):
        it.__dict__.pop(_QUEUE, None)  # (a persistent-workers loader starts its next epoch's prefetch here)
        return reset(it, *args, **kwargs)

    return {"_next_index": _next_index, "__next__": __next__, "_reset": _reset}


def _in_order_map_style(it) -> bool:
    from torch.utils.data.dataloader import _DatasetKind

    return getattr(it, "_dataset_kind", None) == _DatasetKind.Map and getattr(it, "_in_order", True)


def _print(t: torch.Tensor) -> tuple:
    """(shape, dtype, a copy of its first PRINT values): enough to find the batch again, and no reference to it (a
    kept image batch would hold its memory)."""
    return t.shape, t.dtype, _head(t)


def _head(t: torch.Tensor) -> torch.Tensor:
    """A copy of t's first PRINT values, flat, on t's device: no host sync for a batch the loader yields on a GPU
    (it is compared on the host only at a finding), and of a non-contiguous tensor only the leading rows that hold
    them are made contiguous, not all of it."""
    t = t.detach()
    if t.dim() > 1 and not t.is_contiguous():
        t = t[:-(-PRINT // max(1, t[0].numel()))]
    return t.reshape(-1)[:PRINT].clone()


def dataset_indices(batch) -> list[int] | None:
    """The dataset indices of the kept batch that holds one of `batch`'s tensors (same shape, dtype and first
    values), newest first; None when none does."""
    wanted = [t for _, t in flat_tensors(batch) if t.numel()]
    for indices, prints in reversed(_yielded):
        for t in wanted:
            for shape, dtype, head in prints:
                if shape == t.shape and dtype == t.dtype and len(indices) == (t.shape[0] if t.dim() else 1) \
                        and _same(head.cpu(), _head(t).cpu()):
                    return indices
    return None


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where the other has NaN (the batch a data finding is about holds them)."""
    if not (a.is_floating_point() or a.is_complex()):
        return torch.equal(a, b)
    return bool(((a == b) | (torch.isnan(a) & torch.isnan(b))).all())
