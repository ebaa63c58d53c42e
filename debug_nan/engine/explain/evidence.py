"""What a finding is built from (a module's class, a batch's sample ids, tensors' statistics, the machine), and the
findings that need no op-level replay (a non-finite batch, a trip the replay could not explain, an explosion)."""

from __future__ import annotations

import math
import socket

import torch
from torch import nn

from debug_nan.engine.explain.diagnose import SUGGESTIONS, describe_rows
from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.sharded import user_class, user_path
from debug_nan.engine.stats import flat_tensors, tensor_stats
from debug_nan.engine.vocabulary import PHASE_OF_KIND, Cause, CheckKind, Phase
from debug_nan.engine.watch.sampled import dataset_indices
from debug_nan.engine.watch.watch import Check

STAYED_FINITE = "the op-level replay of the same micro-batch stayed finite"  # (engine/explain/fallback.py)


def machine(driver) -> str:
    """"rank 1 on host gpu-07, device cuda:0 (NVIDIA H100 80GB HBM3)": where a transient fault happened."""
    device = getattr(driver, "device", None)
    name = ""
    if isinstance(device, torch.device) and device.type == "cuda" and torch.cuda.is_available():
        name = f" ({torch.cuda.get_device_name(device)})"
    dist = getattr(driver, "dist", None)
    rank = getattr(dist, "rank", None)
    if rank is None and torch.distributed.is_available() and torch.distributed.is_initialized():
        rank = torch.distributed.get_rank()
    return (f"rank {rank if rank is not None else 0} on host {socket.gethostname()}, device "
            f"{device if device is not None else 'cpu'}{name}")


def module_type(model: nn.Module, path: str) -> str:
    """The class name of the submodule at `path` ("" for the root path or a path that is not a module)."""
    if not path:
        return ""
    try:
        return user_class(type(model.get_submodule(path))).__name__
    except AttributeError:  # a path shown without its wrappers (FSDP1's `_fsdp_wrapped_module.`): the inner module
        found = [m for name, m in model.named_modules() if user_path(name) == path]
        return user_class(type(found[-1])).__name__ if found else ""


def sample_ids(batch) -> list[str] | None:
    """The batch's `sample_ids` list, when it carries one (a dict batch)."""
    if isinstance(batch, dict) and isinstance(batch.get("sample_ids"), (list, tuple)):
        return [str(i) for i in batch["sample_ids"]]
    return None


def stats_dict(named: list[tuple[str, torch.Tensor]], limit: int = 6) -> dict[str, dict]:
    """name -> TensorStats dict for the first `limit` tensors (evidence in the finding)."""
    out = {}
    for name, t in named[:limit]:
        try:
            out[name] = tensor_stats(t).to_dict()
        except RuntimeError:
            continue
    return out


def data_finding(step: int, micro: int, raw, check: Check) -> Finding:
    """The batch itself was non-finite before the model saw it: where in the tensor, and whose rows."""
    tensor = dict(flat_tensors(raw))[check.name]
    bad = ~torch.isfinite(tensor)
    n_nan, n_inf = int(torch.isnan(tensor).sum()), int(torch.isinf(tensor).sum())
    where = bad.nonzero()[:6].tolist()
    rows = bad.reshape(bad.shape[0], -1).any(dim=1).nonzero().squeeze(1) if tensor.dim() else None
    owners = f"; rows belong to {describe_rows(rows, tensor.shape[0], raw)}" if rows is not None else ""
    indices = dataset_indices(raw) if rows is not None and sample_ids(raw) is None else None
    if indices is not None and len(indices) == tensor.shape[0]:  # (the DataLoader's sampler named the records)
        shown = [indices[r] for r in rows.tolist()[:8]]
        owners = (f"; row{'s' if len(rows) > 1 else ''} {', '.join(map(str, rows.tolist()[:8]))} of the batch "
                  f"{'are' if len(rows) > 1 else 'is'} dataset index {', '.join(map(str, shown))}"
                  f"{' ...' if len(rows) > 8 else ''} (the DataLoader's sampler)")
    key = f"key `{check.name}`" if check.name else "the batch tensor"
    explanation = (f"The batch itself is non-finite before the model sees it: {key} "
                   f"{list(tensor.shape)} holds {n_nan} NaN and {n_inf} Inf of {tensor.numel()} values, at "
                   f"positions {where}{' ...' if bad.sum() > 6 else ''}{owners}.")
    return Finding(step=step, micro_step=micro, phase=Phase.DATA, module="", module_type="", op=None,
                   kind="nan" if n_nan else "inf", cause=Cause.NONFINITE_INPUT, explanation=explanation,
                   source=None, suggestions=list(SUGGESTIONS[Cause.NONFINITE_INPUT]), sample_ids=sample_ids(raw),
                   inputs={check.name: tensor_stats(tensor).to_dict()}, watch=f"data `{check.label}`",
                   detected_by="data check")


def watch_only_finding(step: int, micro: int, raw, check: Check, model: nn.Module, why: str | None = None) -> Finding:
    """What the watch saw, when the op-level replay could not name the op: `why` says why (default: the replay
    stayed finite)."""
    phase = PHASE_OF_KIND.get(check.kind, "forward")
    module = check.name if check.kind == CheckKind.FORWARD else ""
    why = why or (f"{STAYED_FINITE}: the value depends on something the replay could not restore (a "
                  f"non-deterministic kernel, state outside the model and optimizer).")
    explanation = f"The watch saw {check.said()}, but {why}"
    return Finding(step=step, micro_step=micro, phase=phase, module=module, module_type=module_type(model, module),
                   op=None, kind="nan" if math.isnan(check.value) else "inf", cause=Cause.UNKNOWN,
                   explanation=explanation, source=None, suggestions=list(SUGGESTIONS[Cause.UNKNOWN]),
                   sample_ids=sample_ids(raw), watch=check.said(),
                   detected_by="watch")


def explosion_finding(record, floor: float, steps: list, micro: int, threshold: float, model: nn.Module) -> Finding:
    """The total gradient norm of `record` (a StepRecord) passed `threshold`, growing from `floor`; nothing is
    non-finite yet."""
    name, value = max(record.grad_norms.items(), key=lambda kv: kv[1])
    module = name.rsplit(".", 1)[0] if "." in name else ""
    series = ", ".join(f"{r.grad_norm:.3g}" for r in steps if r.grad_norm is not None)
    share = value * value / max(record.grad_norm ** 2, 1e-30)
    explanation = (f"The total gradient norm grew from {floor:.3g} to {record.grad_norm:.3g} by step {record.step}, "
                   f"past the explosion threshold {threshold:g} (--explosion-threshold) and "
                   f"{record.grad_norm / max(floor, 1e-12):.3g}x the "
                   f"smallest earlier norm (per step: {series}). Largest: `{name}` {value:.3g} ({share:.0%} of "
                   f"the squared total). Nothing is non-finite yet: stopped before the overflow.")
    # (a parameter of the root itself, `weight` of a bare Linear: its module is the model, not "outside the model")
    owner = module_type(model, module) if module else user_class(type(model)).__name__
    return Finding(step=record.step, micro_step=micro, phase=Phase.BACKWARD, module=module,
                   module_type=owner, op=None, kind="inf", cause=Cause.GRADIENT_EXPLOSION,
                   explanation=explanation, source=None, suggestions=list(SUGGESTIONS[Cause.GRADIENT_EXPLOSION]),
                   watch=f"grad norm {record.grad_norm:.4g}", detected_by="gradient history")
