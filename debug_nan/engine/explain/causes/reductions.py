"""Reductions that divide by a count of zero (0/0 inside one kernel), and losses of impossible targets."""

from __future__ import annotations

import math

import torch

from debug_nan.engine.explain.causes.masking import first_input
from debug_nan.engine.trace.events import OpEvent
from debug_nan.engine.vocabulary import Cause

VARIANCE_OPS = {"std", "var", "std_mean", "var_mean"}
MEAN_OPS = {"mean"}
# elementwise losses whose "mean" reduction divides by the number of elements
MEAN_LOSSES = {"mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy",
               "binary_cross_entropy_with_logits", "soft_margin_loss", "kl_div", "poisson_nll_loss",
               "multilabel_margin_loss", "multi_margin_loss"}
# class-index losses whose "mean" divides by the total weight of the targets that are not ignore_index
NLL_OPS = {"nll_loss", "nll_loss_forward", "nll_loss2d", "nll_loss2d_forward", "nll_loss_nd", "cross_entropy_loss"}
CTC_OPS = {"_ctc_loss", "ctc_loss", "_cudnn_ctc_loss", "_use_cudnn_ctc_loss"}
MEAN = 1  # at::Reduction::Mean


def _reduced_count(x: torch.Tensor, dims) -> int:
    """How many elements each output of a reduction over `dims` (None or [] = all) sums."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return x.numel()
    dims = [dims] if isinstance(dims, int) else dims
    return math.prod(x.shape[d] for d in dims) if x.dim() else 1


def zero_count_rule(event: OpEvent, name: str) -> tuple[str, str] | None:
    x = first_input(event)
    if x is None:
        return None
    s = event.scalars
    if name in VARIANCE_OPS:
        n = _reduced_count(x, s.get("dim"))
        correction = s.get("correction")
        if correction is None:
            correction = 1 if s.get("unbiased", True) else 0
        if n - float(correction) > 0:
            return None
        return Cause.DIV_BY_ZERO, (f"{event.op} over {n} element{'s' if n != 1 else ''} per output with correction "
                               f"{correction:g}: the variance divides by max(0, n - correction) = 0, so every output "
                               f"is 0/0 = NaN (input {list(x.shape)}, dim {s.get('dim')}).")
    if name in MEAN_OPS:
        n = _reduced_count(x, s.get("dim"))
        if n:
            return None
        return Cause.DIV_BY_ZERO, (f"{event.op} of an empty selection: 0 elements per output (input {list(x.shape)}, "
                               f"dim {s.get('dim')}), and a mean over 0 elements is 0/0 = NaN.")
    if name in MEAN_LOSSES:
        if s.get("reduction", MEAN) != MEAN or x.numel():
            return None
        return Cause.DIV_BY_ZERO, (f"{event.op} of an empty selection: input {list(x.shape)} has 0 elements, and the "
                               f"'mean' reduction divides the sum by that count: 0/0 = NaN.")
    if name in NLL_OPS:
        return _nll_rule(event, x)
    return None


def _nll_rule(event: OpEvent, x: torch.Tensor) -> tuple[str, str] | None:
    s = event.scalars
    target = dict(event.inputs).get("target")
    if target is None or s.get("reduction", MEAN) != MEAN:
        return None
    ignore = s.get("ignore_index", -100)
    kept = target != ignore
    n_kept = int(kept.sum())
    weight = dict(event.inputs).get("weight")
    if n_kept == 0:
        return Cause.DIV_BY_ZERO, (f"{event.op}: every one of the {target.numel()} targets equals "
                                   f"ignore_index={ignore}, "
                               f"so the 'mean' reduction divides a sum over 0 targets by a total weight of 0: "
                               f"0/0 = NaN.")
    if weight is not None:
        total = float(weight[target[kept]].sum())
        if total == 0:
            return Cause.DIV_BY_ZERO, (f"{event.op}: the {n_kept} targets that are not ignore_index={ignore} all have "
                                   f"class weight 0, so the 'mean' reduction divides by a total weight of 0: "
                                   f"0/0 = NaN.")
    return None


def ctc_rule(event: OpEvent, name: str) -> tuple[str, str] | None:
    """CTC of a target that no alignment can produce: -log(0) = inf, in any precision."""
    if name not in CTC_OPS or event.kind != "inf":
        return None
    named = dict(event.inputs)
    targets, in_len, tg_len = named.get("targets"), named.get("input_lengths"), named.get("target_lengths")
    infeasible = []
    if targets is not None and isinstance(in_len, torch.Tensor) and isinstance(tg_len, torch.Tensor):
        offsets = torch.cumsum(tg_len, 0) - tg_len
        for b in range(tg_len.numel()):
            n = int(tg_len[b])
            row = targets[b, :n] if targets.dim() == 2 else targets[int(offsets[b]):int(offsets[b]) + n]
            repeats = int((row[1:] == row[:-1]).sum()) if n > 1 else 0
            if int(in_len[b]) < n + repeats:
                infeasible.append(f"#{b} (input length {int(in_len[b])} < target length {n} + {repeats} repeats)")
    if infeasible:
        why = (f"-log(0) in any precision: no alignment exists for sample{'s' if len(infeasible) > 1 else ''} "
               f"{', '.join(infeasible[:6])}{' ...' if len(infeasible) > 6 else ''}")
    else:
        why = "-log(0): the lengths allow an alignment, so the log-probabilities of the labels it needs were 0"
    return Cause.INFEASIBLE_TARGET, (f"{event.op} is +inf: the target sequence has probability 0 under the model, so "
                                 f"the loss is {why}. This is not an overflow.")
