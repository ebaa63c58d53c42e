"""Tensor statistics for logs and evidence (one helper, safe for integer tensors and non-finite values), and the
walk over a batch's tensors (flat_tensors, map_tensors: every container torch.utils._pytree knows, and any Mapping)."""

from __future__ import annotations

from copy import copy as shallow_copy
from collections import UserDict
from collections.abc import Callable, Mapping

import torch
from torch.utils import _pytree as pytree

from debug_nan.engine.stats_record import TensorStats


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


_LEAVES = frozenset({str, bytes, int, float, bool, complex, type(None)})  # never containers: no lookup


def flat_tensors(obj, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    """(path, tensor) for every tensor in a batch (the containers `map_tensors` walks); other values are skipped.
    A path names keys and fields with dots and indices in brackets: `inputs.ids`, `[0]`, `pair[1].mask`."""
    if isinstance(obj, torch.Tensor):
        return [(prefix, obj)]
    node = _node(obj)
    if node is None:
        return []
    out: list[tuple[str, torch.Tensor]] = []
    indexed, items, _ = node
    for key, value in items:
        out += flat_tensors(value, f"{prefix}[{key}]" if indexed else _joined(prefix, key))
    return out


def map_tensors(fn, obj):
    """`obj` with every tensor t in it replaced by fn(t), each container rebuilt as its own type: whatever
    torch.utils._pytree knows (dict, list, tuple, named tuples, OrderedDict, dataclasses registered with it,
    transformers' ModelOutput), and any other Mapping or list/tuple subclass (transformers' BatchEncoding). Other
    values pass through as they are; `obj` itself is never changed."""
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    node = _node(obj)
    if node is None:
        return obj
    _, items, rebuild = node
    return rebuild([map_tensors(fn, value) for _, value in items])


def move_to(obj, device: torch.device, copy: bool = False):
    """Every tensor in a nested batch on `device` (non_blocking); other values pass through. With copy=True
    every tensor is a fresh copy even where it is already on `device` (a replay must not share storage with
    anything user code may change in place)."""
    return map_tensors(lambda t: t.to(device, non_blocking=True, copy=copy), obj)


def capture_batch(obj, device: torch.device):
    """The batch as produced, safe from in-place changes by user code: tensors already on `device` (which the
    run would hand to user code as they are) are cloned; the others are kept, since the run only ever gives user
    code a copy of them on `device`. Its containers are new ones of the same types (user code may also replace a
    key of a dict or a BatchEncoding)."""
    return map_tensors(lambda t: t.detach().clone() if _may_alias(t.device, device) else t, obj)


def _node(x) -> tuple[bool, list[tuple], Callable[[list], object]] | None:
    """A container's (whether its keys are indices, its (key, child) pairs, rebuild(children) -> a new container
    of its type), or None for a leaf. Keys: an index, a dict key, or pytree's key entry (MappingKey, GetAttrKey).

    A plain dict, list or tuple is walked here directly (a batch's usual shape, on every micro-batch: pytree's
    own flatten costs several times more). Another type pytree has a registration for (named tuples, OrderedDict,
    a registered dataclass, ModelOutput) is walked by that registration. A Mapping or list/tuple subclass it has
    none for (transformers' BatchEncoding, a UserDict) is walked here without registering it: a registration is
    global, and would change how the user's own torch.compile, torch.export or FSDP see their values."""
    kind = type(x)
    if kind in _LEAVES:
        return None
    if kind is dict:
        return False, list(x.items()), lambda values: dict(zip(x, values))
    if kind is list or kind is tuple:
        return True, list(enumerate(x)), kind
    registered = pytree.SUPPORTED_NODES.get(pytree._get_node_type(x))
    if registered is not None:
        children, context = registered.flatten_fn(x)
        if registered.flatten_with_keys_fn is None:  # (registered without key names: indices)
            return True, list(enumerate(children)), lambda values: registered.unflatten_fn(values, context)
        keys = [key for key, _ in registered.flatten_with_keys_fn(x)[0]]
        return False, list(zip(keys, children)), lambda values: registered.unflatten_fn(values, context)
    if isinstance(x, Mapping):
        return False, list(x.items()), lambda values: _mapping_like(x, dict(zip(x, values)))
    if isinstance(x, (list, tuple)):
        return True, list(enumerate(x)), lambda values: type(x)(values)
    return None


def _joined(path: str, key) -> str:
    """`path` extended by a key or a field: `.name` (no dot at the start); `[i]` for pytree's SequenceKey."""
    if isinstance(key, pytree.SequenceKey):
        return f"{path}[{key.idx}]"
    name = key.key if isinstance(key, pytree.MappingKey) else key.name if isinstance(key, pytree.GetAttrKey) \
        else key
    return f"{path}.{name}" if path else str(name)


def _mapping_like(x: Mapping, values: dict):
    """A Mapping of x's type holding `values`, x itself unchanged: a UserDict (BatchEncoding) is copied with its
    other attributes (the tokenizer's encodings) and given the new items; another Mapping is built from a dict,
    or is a dict where its type cannot be built from one."""
    if isinstance(x, UserDict):
        new = shallow_copy(x)
        new.data = values
        return new
    try:
        return type(x)(values)
    except TypeError:
        return values


def _may_alias(a: torch.device, b: torch.device) -> bool:
    """Whether .to(b) may return a tensor on `a` itself (a device without an index may be the current one)."""
    return a.type == b.type and (a.index == b.index or a.index is None or b.index is None)


def nonfinite_names(named: list[tuple[str, torch.Tensor]]) -> set[str]:
    """The names whose tensor holds a NaN/Inf (one host sync for all; a replay's, never the watch's hot path)."""
    if not named:
        return set()
    flags = torch.stack([~torch.isfinite(t).all() for _, t in named]).tolist()
    return {name for (name, _), bad in zip(named, flags) if bad}
