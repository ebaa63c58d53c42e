"""The watch's reductions: the L2 norm of every tensor of a list in one fused pass, the check of the parameters and
optimizer state, their (name, tensor) list, and n 0-d values gathered into one float64 vector for the one host
copy."""

from __future__ import annotations

import torch

BIG = 1 << 16  # elements: a CPU tensor this large is reduced alone (a parallel kernel; its Python call is <1% of it)


def l2_norms(tensors: list[torch.Tensor], exact: bool = True) -> list[torch.Tensor]:
    """0-d L2 norm of each tensor: one fused kernel per dtype group. fp16/bf16 are reduced into fp32 (a norm in
    their own range overflows at 65504); fp32/fp64 in their own dtype. `exact=False`: a large contiguous fp32/fp64
    CPU tensor is reduced by a BLAS dot product with itself instead, on every thread (CPU `_foreach_norm` loops on
    one: 17M GPT-2-like gradients, 3.1 ms against 1.6 ms with 2 threads); it differs from torch's norm in the last
    bits (the order of the sums), so the norms that clipping reuses stay exact."""
    wide = (torch.float32, torch.float64)
    if not exact:
        dots = [i for i, t in enumerate(tensors) if t.device.type == "cpu" and t.numel() >= BIG
                and t.dtype in wide and t.is_contiguous()]
        if dots:
            return _by_index(tensors, dots, lambda ts: [torch.dot(t.view(-1), t.view(-1)).sqrt() for t in ts],
                             l2_norms)
    narrow = [i for i, t in enumerate(tensors) if t.dtype not in wide]
    if not narrow:
        return list(torch._foreach_norm(tensors))
    return _by_index(tensors, narrow, lambda ts: torch._foreach_norm(ts, 2, dtype=torch.float32),
                     lambda ts: torch._foreach_norm(ts))


def state_sums(tensors: list[torch.Tensor], plan: list[int] | None = None) -> list[torch.Tensor]:
    """One 0-d value per tensor that is non-finite when an element is: the parameters and optimizer state after an
    update (finiteness, and the reading a re-run is checked against: engine/replay/catch_up.py). On the CPU each tensor
    of BIG elements or more is summed alone: CPU `_foreach_norm` loops over the list on ONE thread, a sum uses them all
    (3 x 17M floats of GPT-2-like AdamW state: 20 ms as norms, 10 ms as sums, 2 threads). The rest, and every
    tensor on a GPU (one fused kernel there), go through l2_norms. A sum can overflow with finite elements (as a
    norm can): the watch's second look settles any non-finite value. `plan`: sum_plan(tensors), kept by a caller
    that checks the same list every step."""
    big = sum_plan(tensors) if plan is None else plan
    if not big:
        return l2_norms(tensors)
    return _by_index(tensors, big, lambda ts: [t.sum(dtype=torch.float32) if t.dtype in (torch.float16, torch.bfloat16)
                                               else t.sum() for t in ts], l2_norms)


def _by_index(tensors: list, chosen: list[int], first, rest) -> list:
    """first(the tensors at `chosen`) and rest(the others), each result back at its tensor's index."""
    out: list = [None] * len(tensors)
    picked = set(chosen)
    others = [i for i in range(len(tensors)) if i not in picked]
    for idx, fn in ((chosen, first), (others, rest)):
        if idx:
            for i, value in zip(idx, fn([tensors[i] for i in idx])):
                out[i] = value
    return out


def sum_plan(tensors: list[torch.Tensor]) -> list[int]:
    """The indices state_sums sums (it takes the norm of the others)."""
    return [i for i, t in enumerate(tensors) if t.device.type == "cpu" and t.numel() >= BIG]


def param_and_state_tensors(named_params, optimizer) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) for every parameter and every floating optimizer state tensor ("w (optimizer exp_avg)").
    Not detached (a detach per tensor costs more than the check of a small one): read them under no_grad."""
    out = []
    states = optimizer.state if optimizer is not None else {}
    for name, p in named_params:
        out.append((name, p))
        state = states.get(p)
        if state:
            for key, value in state.items():
                if isinstance(value, torch.Tensor) and value.dim() > 0 and value.is_floating_point():
                    out.append((f"{name} (optimizer {key})", value))
    return out


def stack64(values: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """[n] float64 on `device` from n 0-d tensors (mixed dtypes promote; mixed devices are gathered first)."""
    try:
        stacked = torch.stack(values)
    except RuntimeError:  # a model spread over devices
        stacked = torch.stack([v.to(device) for v in values])
    # float64: a float64 model's values above float32's range must not read as Inf
    return stacked.to(device, torch.float64)


__all__ = ["BIG", "l2_norms", "param_and_state_tensors", "stack64", "state_sums", "sum_plan"]
