"""`--fsdp` under torchrun: the Trainer's model sharded with FSDP2 instead of wrapped in DDP.

Every block of a `ModuleList` (a transformer's layers) is its own FSDP2 unit, then the root: each rank keeps 1/N of
the parameters, gradients and optimizer state; a unit's parameters are all-gathered for its forward and backward,
its gradients reduce-scattered in the backward. The parameters and buffers are first broadcast from rank 0, as DDP
does (fully_shard keeps each rank's own slice of the weights it finds). The optimizer is built afterwards, on the
sharded parameters. The watch, the copy and the replay then read each rank's shards (engine/sharded.py)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


def shard_model(model: nn.Module, device: torch.device) -> int:
    """Broadcast `model`'s state from rank 0, then fully_shard each ModuleList block and the root -> the units."""
    from torch.distributed.fsdp import fully_shard  # (torch >= 2.6: the public path)

    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            dist.broadcast(t.data, src=0)
    blocks = [block for m in model.modules() if isinstance(m, nn.ModuleList) for block in m
              if any(p.requires_grad for p in block.parameters())]
    mesh = None
    if device.type == "cuda":
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh("cuda", (dist.get_world_size(),))
    for block in blocks:
        fully_shard(block, **({"mesh": mesh} if mesh is not None else {}))
    fully_shard(model, **({"mesh": mesh} if mesh is not None else {}))
    return len(blocks) + 1


__all__ = ["shard_model"]
