"""`--fsdp` under torchrun: the Trainer's model sharded with FSDP2 instead of wrapped in DDP.

Every block of a `ModuleList` (a transformer's layers) is its own FSDP2 unit, then the root: each rank keeps 1/N of
the parameters, gradients and optimizer state; a unit's parameters are all-gathered for its forward and backward,
its gradients reduce-scattered in the backward. The parameters and buffers are first broadcast from rank 0, as DDP
does (fully_shard keeps each rank's own slice of the weights it finds). The optimizer is built afterwards, on the
sharded parameters. The watch, the copy and the replay then read each rank's shards (engine/sharded.py).

--checkpoint into the sharded model: a checkpoint holds full (unsharded) tensors, as a plain run, DDP or FSDP1's
full state dict (AAM's default) save them; every rank reads the whole file and keeps its own slice of each tensor
(torch.distributed.checkpoint.state_dict's full_state_dict loading, no collective)."""

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


def load_full_model_state(model: nn.Module, state: dict) -> None:
    """Full tensors `state` (names checked by the caller) into the sharded `model`: each rank keeps its slice."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

    set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))


def load_full_optimizer_state(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> None:
    """A full optimizer state_dict into the optimizer of the sharded `model`: each rank keeps its slice of every
    state tensor (Adam's moments). `state` is keyed as `optimizer.state_dict()` keys it (parameter numbers in
    param-group order, a plain run's or DDP's) or by parameter name (FSDP1's full optim_state_dict, torch's
    get_optimizer_state_dict): the numbers are turned into the names torch's loader wants."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, keyed_by_name(model, optimizer, state),
                             options=StateDictOptions(full_state_dict=True))


def keyed_by_name(model: nn.Module, optimizer: torch.optim.Optimizer, state: dict) -> dict:
    """`state` with its parameter numbers replaced by the parameters' names in `model` (names kept as they are).
    The k-th number of the saved groups is the k-th parameter of the optimizer's groups, as Optimizer.load_state_dict
    pairs them; a count that differs is the loader's error (the groups do not fit)."""
    saved = [k for g in state["param_groups"] for k in g["params"]]
    if all(isinstance(k, str) for k in saved):
        return state
    names = {id(p): name for name, p in model.named_parameters()}
    own = [p for g in optimizer.param_groups for p in g["params"]]
    if len(own) != len(saved):
        raise ValueError(f"the checkpoint's optimizer holds {len(saved)} parameters, the run's {len(own)}")
    name_of = {k: names[id(p)] for k, p in zip(saved, own)}
    return {"state": {name_of[k]: v for k, v in state["state"].items()},
            "param_groups": [{**g, "params": [name_of[k] for k in g["params"]]} for g in state["param_groups"]]}


__all__ = ["keyed_by_name", "load_full_model_state", "load_full_optimizer_state", "shard_model"]
