"""Sharded models (FSDP2's `fully_shard`, DTensor; FSDP1): the user's names, and each rank's own shard.

Under FSDP2 a parameter (its gradient, its optimizer state) is a DTensor whose `_local_tensor` is this rank's shard
[rows / world, ...]: the watch reads it, the snapshot copies it (memory per rank: 1/world of the unsharded copy), and
a restore writes into it in place. Norms of sharded tensors are summed over the ranks (squared) to give the global
ones that `clip_grad_norm_` computes. Wrappers add path segments the user never wrote (`_fsdp_wrapped_module.`,
`_checkpoint_wrapped_module.`, `_orig_mod.`): every name shown leaves them out.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (the user's names below are read without torch: the top process of `run -- PROGRAM`)
    import torch

WRAPPER_SEGMENTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod",
                              "_dmp_wrapped_module"})


def user_path(name: str) -> str:
    """A dotted module or parameter path as the user wrote it:
    `_fsdp_wrapped_module.stages.0._checkpoint_wrapped_module.attn` -> `stages.0.attn`."""
    if "_" not in name:
        return name
    return ".".join(part for part in name.split(".") if part not in WRAPPER_SEGMENTS)


def user_class(cls: type) -> type:
    """The user's class of a module: FSDP2's `fully_shard` swaps a module's class for a subclass of it and of
    FSDPModule named `FSDP<Name>`; this is `<Name>`, else `cls`."""
    if any(base.__name__ == "FSDPModule" for base in cls.__bases__):
        return next((base for base in cls.__bases__ if base.__name__ != "FSDPModule"), cls)
    return cls


def has_fsdp(model: torch.nn.Module) -> bool:
    """Whether FSDP (FSDP2's `fully_shard` or FSDP1's wrapper) manages some part of `model`: it frees unsharded
    parameters' storage between uses."""
    return any(hasattr(m, "_get_fsdp_state") or type(m).__name__ == "FullyShardedDataParallel"
               for m in model.modules())


def is_dtensor(t) -> bool:
    return type(t).__name__ == "DTensor" and hasattr(t, "_local_tensor")


def local(t: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (the same storage: an in-place write changes the DTensor), else `t`."""
    return t._local_tensor if is_dtensor(t) else t


def any_sharded(tensors) -> bool:
    return any(is_dtensor(t) for t in tensors)


def locals_of(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each tensor's local shard (a list of plain tensors for torch's foreach kernels)."""
    return [local(t) for t in tensors]


def sharded_flags(tensors: list[torch.Tensor]) -> list[bool]:
    """Which tensors are split over the ranks (a DTensor with a Shard placement): their norms are summed."""
    out = []
    for t in tensors:
        placements = getattr(t, "placements", ()) if is_dtensor(t) else ()
        out.append(any(type(p).__name__ in ("Shard", "_StridedShard") for p in placements))
    return out


def global_norms(norms: torch.Tensor, sharded: torch.Tensor) -> torch.Tensor:
    """[n] local L2 norms -> [n] global ones: sqrt(sum over ranks of norm^2) where `sharded` [n] bool, else the
    local value (a replicated tensor's norm is the same on every rank). One SUM all-reduce, no host sync. A NaN on
    one rank's shard makes the global norm NaN on every rank: the ranks agree on what is harm."""
    import torch  # (here, not at the top: see the imports)
    import torch.distributed as dist

    squared = torch.where(sharded, norms.double() * norms.double(), torch.zeros_like(norms, dtype=torch.float64))
    dist.all_reduce(squared)
    return torch.where(sharded, squared.sqrt(), norms.double())


__all__ = ["any_sharded", "global_norms", "has_fsdp", "is_dtensor", "local", "locals_of", "sharded_flags",
           "user_class", "user_path"]
