"""What the tracer records about an origin (OpEvent), and the small tensor helpers it is built with."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache

import torch
from torch.utils._pytree import tree_flatten


@dataclass(eq=False)
class OpEvent:
    """One origin of non-finite values: an op that made a NaN from NaN-free inputs or an Inf from Inf-free inputs,
    or a tensor that was already non-finite when the replay saw it (`label` set, `op` empty).

    Tensors are kept by reference (they are protected from later in-place writes by copy-on-write, see
    provenance.Lineage.protect); beyond the tracer's limit of kept origins they are dropped and `note` says so."""

    op: str  # "aten._softmax.default"; "" for a marked or pre-existing tensor
    phase: str  # "data" | "forward" | "loss" | "backward" | "optimizer"
    module: str  # dotted path of the innermost module whose forward ran it (backward: whose forward made the node)
    module_type: str  # its class name ("" outside any module in the loss)
    kind: str  # "nan" | "inf": what this origin made (a NaN birth may also make Infs)
    source: str | None  # "model.py:57": the user line (backward: the forward line that created the node)
    source_line: str | None
    backward_node: str | None  # "SoftmaxBackward0" for an op run by autograd's backward
    forward_source: str | None
    inputs: list[tuple[str, torch.Tensor]]  # by schema name; in-place ops: the values before the op
    outputs: list[tuple[str, torch.Tensor]]
    scalars: dict[str, object] = field(default_factory=dict)
    func: object = None
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    node: object = None  # the running autograd node (backward only)
    saved: dict[str, torch.Tensor] = field(default_factory=dict)  # its saved forward tensors (_saved_self, ...)
    # provenance
    seq: int = 0  # op number when it happened (tracer.ops_seen): the order of origins
    id: int = -1  # index in tracer.origins
    deliberate: bool = False  # an Inf written on purpose: masked_fill/fill/full/where of an inf scalar, an inf constant
    label: str | None = None  # a marked or pre-existing tensor: "batch `x`", "parameter `w`", "buffer `mask`"
    module_class: str = ""  # "debug_nan.aam.model.attention.SelfAttention": decides the wording (built-in model or not)
    inf_sources: list["OpEvent"] = field(default_factory=list)  # a NaN birth: the Inf origins its inputs carried
    # the origins behind its finite inputs: values made finite again after a non-finite step (1/sqrt(inf) = 0)
    ancestors: list["OpEvent"] = field(default_factory=list)
    # backward: the origin its node's forward op was (the forward log(0) = -inf behind LogBackward's 0/0, when a
    # torch.where hid that -inf from the loss): the same singular point, met first in the forward
    forward_origin: "OpEvent | None" = None
    note: str | None = None
    # the installed library's line where the op itself ran, beside `source` (torch/nn/functional.py:2987 under the
    # user's line that called the nn.LayerNorm), and its code; None when the user's own code called the op
    inside: str | None = None
    inside_line: str | None = None


# ops whose output is uninitialised memory (it may hold an old NaN) or that overwrite their destination whole:
# the destination's old contents are not an input
UNINITIALISED = ("empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted")
OVERWRITING = ("copy_", "fill_", "zero_", "uniform_", "normal_", "random_", "bernoulli_", "exponential_",
               "geometric_", "cauchy_", "log_normal_", "set_", "_foreach_copy_", "_foreach_zero_", "masked_scatter_")


# ops that write arguments their schema does not annotate as written: batch norm in training mode updates
# running_mean/var in place. Judged like in-place ops (inputs as they were before the op), so an Inf input
# to a BatchNorm is named, not the buffer the op itself just poisoned
HIDDEN_WRITES = {name: frozenset({"running_mean", "running_var"}) for name in (
    "native_batch_norm", "cudnn_batch_norm", "miopen_batch_norm", "batch_norm_update_stats")}


@dataclass(frozen=True)
class OpInfo:
    name: str  # "_softmax"
    mutable: bool
    written: frozenset  # argument names the op writes into (self of add_, out=, running_var of batch_norm)
    overwriting: bool  # the destination's old values do not flow into the result


@lru_cache(maxsize=None)
def op_info(func) -> OpInfo:
    schema = func._schema
    name = schema.name.split("::")[-1]
    written = frozenset(a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write)
    hidden = HIDDEN_WRITES.get(name, frozenset())
    return OpInfo(name, schema.is_mutable or bool(hidden), written | hidden, name in OVERWRITING)


def named_tensors(func, args, kwargs) -> tuple[list[tuple[str, torch.Tensor]], dict[str, object]]:
    """Tensor arguments by schema name (lists expanded as name[i]) and the non-tensor arguments."""
    names = [a.name for a in func._schema.arguments]
    tensors, scalars = [], {}
    for name, value in list(zip(names, args)) + list(kwargs.items()):
        if isinstance(value, torch.Tensor):
            tensors.append((name, value))
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
            tensors += [(f"{name}[{i}]", v) for i, v in enumerate(value)]
        else:
            scalars[name] = value
    return tensors, scalars


def tensor_args(args, kwargs) -> list[torch.Tensor]:
    """An op's tensor arguments, lists one level deep (its schema's Tensor[]): cheaper than a pytree flatten."""
    out = []
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            out.append(value)
        elif isinstance(value, (list, tuple)):
            out += [v for v in value if isinstance(v, torch.Tensor)]
    return out


def split_foreach(func, args, kwargs) -> list[tuple[tuple, dict]] | None:
    """A multi-tensor op's call (`_foreach_*`, `_fused_*` such as fused AdamW) as one call per list element:
    every list argument (Tensor[], Scalar[]) and a 1-D `scalars` tensor of the same length are sliced, empty
    lists (AdamW's max_exp_avg_sqs without amsgrad) and the rest kept. None when it is not such an op or its
    lists do not line up. The same kernels on one element each give the same values."""
    schema = func._schema
    if not schema.name.split("::")[-1].startswith(("_foreach_", "_fused_")):
        return None
    names = [a.name for a in schema.arguments]
    lists = {len(v) for v in list(args) + list(kwargs.values()) if isinstance(v, (list, tuple))} - {0}
    if len(lists) != 1 or min(lists) < 2:
        return None
    n = lists.pop()

    def pick(name: str, value, i: int):
        if isinstance(value, (list, tuple)):
            return [value[i]] if value else value
        if name == "scalars" and isinstance(value, torch.Tensor) and value.dim() == 1 and len(value) == n:
            return value[i:i + 1]
        return value

    return [(tuple(pick(name, v, i) for name, v in zip(names, args)),
             {k: pick(k, v, i) for k, v in kwargs.items()}) for i in range(n)]


COLLECTIVE_NAMESPACES = ("c10d", "_c10d_functional", "c10d_functional")


def collective_buffers(func, args, kwargs) -> tuple[list[torch.Tensor], list[torch.Tensor]] | None:
    """For a collective (c10d's ops, the functional ones DTensor uses): (the buffers it writes whole with the
    ranks' values: `output_tensor`, `output_tensors`, nested lists too; this rank's other tensors, what it sends);
    None for any other op. Their schemas mark no write, and the work may finish after the call returns."""
    if getattr(func, "namespace", None) not in COLLECTIVE_NAMESPACES:
        return None
    names = [a.name for a in func._schema.arguments]
    written, sent = [], []
    for name, value in list(zip(names, args)) + list(kwargs.items()):
        tensors = [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]
        (written if name.startswith("output") else sent).extend(tensors)
    return written, sent


def base_arg_name(name: str) -> str:
    """'self[3]' -> 'self'."""
    return name.split("[", 1)[0]


def scalar_is_inf(scalars: dict[str, object]) -> bool:
    flat, _ = tree_flatten(list(scalars.values()))
    return any(isinstance(v, (float, complex)) and (math.isinf(v.real) or math.isinf(v.imag)) for v in flat)


def _real_view(t: torch.Tensor) -> torch.Tensor | None:
    """The values to judge: floating tensors as they are, complex ones as [..., 2] real/imaginary parts (a NaN in
    either part is a NaN, an Inf an Inf); None for integer and bool tensors, which cannot be non-finite."""
    if t.is_complex():
        return torch.view_as_real(t.detach().resolve_conj())
    if t.is_floating_point():
        return t.detach()
    return None


def has_nonfinite(t: torch.Tensor) -> bool:
    """One aminmax reduction (min/max propagate NaN and show +-Inf): several times faster than isfinite().all()."""
    r = _real_view(t)
    if r is None or r.numel() == 0:
        return False
    lo, hi = torch.aminmax(r)
    return not bool(torch.isfinite(torch.stack([lo, hi])).all())


def nonfinite_flags(tensors: list[torch.Tensor]) -> list[tuple[bool, bool]]:
    """(holds NaN, holds Inf) per tensor, with one host sync per device for all of them."""
    out = [(False, False)] * len(tensors)
    by_device: dict[torch.device, list[tuple[int, torch.Tensor]]] = {}
    for i, t in enumerate(tensors):
        r = _real_view(t)
        if r is not None and r.numel():
            by_device.setdefault(r.device, []).append((i, torch.stack([torch.isnan(r).any(), torch.isinf(r).any()])))
    for pairs in by_device.values():
        values = torch.stack([flag for _, flag in pairs]).tolist()
        for (i, _), (nan, inf) in zip(pairs, values):
            out[i] = (bool(nan), bool(inf))
    return out


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """The same dtype, shape and bytes (-0.0 and 0.0 differ, as two kernels' results may)."""
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.detach().contiguous().view(-1).view(torch.uint8),
                       b.detach().contiguous().view(-1).view(torch.uint8)) if a.numel() else True


def saved_tensors(node) -> dict[str, torch.Tensor]:
    """The forward tensors an autograd node saved, read while it runs (they are freed after backward)."""
    out = {}
    for attr in dir(node):
        if attr.startswith("_saved_") and not attr.endswith("_raw"):
            try:
                value = getattr(node, attr)
            except RuntimeError:
                continue
            if isinstance(value, torch.Tensor):
                out[attr[len("_saved_"):]] = value.detach().clone()
    return out
