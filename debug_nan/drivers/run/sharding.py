"""FSDP2 (`fully_shard`) seen from `debug-nan run`: the parameters as the optimizer holds them.

Inside a forward, FSDP2 swaps each unit's sharded parameters (DTensors, the optimizer's) for unsharded plain ones
and back after it. The root's forward pre-hook, where the watch attaches, runs after FSDP's own (FSDP prepends its
hook), so the root's parameters are the unsharded ones there: the model is recognised by the sharded ones, and the
watch and the snapshot are built while each unit shows its sharded parameters again (`sharded_view`).
"""

from __future__ import annotations

from contextlib import contextmanager

from torch import nn


def _fsdp_params(module: nn.Module) -> list:
    """Every FSDPParam of the FSDP2 units in `module` (torch's private state: [] without FSDP2)."""
    out = []
    for m in module.modules():
        get_state = getattr(m, "_get_fsdp_state", None)
        if get_state is None:
            continue
        try:
            state = get_state()
        except Exception:  # noqa: BLE001 - not an FSDP2 module after all
            continue
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:  # torch < 2.6: one group per unit
            group = getattr(state, "_fsdp_param_group", None)
            groups = [group] if group is not None else []
        for group in groups:
            out += list(getattr(group, "fsdp_params", []))
    return out


def held_parameter_ids(model: nn.Module) -> set[int]:
    """The ids of `model`'s parameters as an optimizer holds them: the live ones and, under FSDP2, the sharded
    DTensors of units that are unsharded now."""
    ids = {id(p) for p in model.parameters()}
    if not isinstance(model, nn.Module):  # (several models watched as one: drivers/run/ensemble.py)
        return ids
    return ids | {id(fp.sharded_param) for fp in _fsdp_params(model)}


@contextmanager
def sharded_view(model: nn.Module):
    """Inside: every FSDP2 unit of `model` shows its sharded parameters (what the optimizer holds); after: each
    shows what it showed before (its unsharded parameters, mid-forward). No data moves."""
    swapped = []
    for fp in _fsdp_params(model):
        shown = _shown(fp)
        if shown is not None and shown is not fp.sharded_param:
            fp._setattr_on_modules(fp.sharded_param)
            swapped.append((fp, shown))
    try:
        yield
    finally:
        for fp, shown in reversed(swapped):
            fp._setattr_on_modules(shown)


def _shown(fp):
    """The parameter object the unit's module holds now for `fp`."""
    info = getattr(fp, "_module_info", None)
    if info is None:
        return None
    return getattr(info.module, info.param_name, None)


__all__ = ["held_parameter_ids", "sharded_view"]
