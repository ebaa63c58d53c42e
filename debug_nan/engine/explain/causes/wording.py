"""Suggestions per cause, and how rows of a tensor are named: in the AAM's terms (samples, ASV slots) only when
the op ran in the built-in model, in neutral terms (samples, positions) for a user's own task."""

from __future__ import annotations

import torch

from debug_nan.engine.stats import flat_tensors
from debug_nan.engine.trace.events import OpEvent
from debug_nan.engine.vocabulary import Cause

BUILTIN_MODEL_PACKAGE = "debug_nan.aam.model."

SUGGESTIONS = {
    Cause.ALL_MASKED_SOFTMAX: [
        "Guard rows with no valid key before the softmax (give them one key, or skip them), not after it: "
        "zeroing the output with torch.where still leaks NaN into the gradients.",
        "Drop all-padding rows before the encoder (pack the valid rows) or make the collate never emit empty rows.",
    ],
    Cause.LOG_OF_NONPOSITIVE: [
        "Clamp the argument: torch.log(x.clamp_min(eps)), or use log_softmax / logsumexp instead of log(softmax).",
        "Check why the value reached 0 or below (an underflowing probability, a zero count, a ReLU output).",
    ],
    Cause.DIV_BY_ZERO: [
        "Add an epsilon to the denominator or clamp it: x / (s + eps), x / s.clamp_min(eps).",
        "Check for empty groups: a sum over zero elements (masked row, empty sample) is 0, a mean over zero "
        "elements (an empty selection, every target equal to ignore_index) is 0/0.",
        "std/var of a single element with correction=1 (the default) is 0/0: use correction=0 or require n > 1.",
    ],
    Cause.INVALID_DOMAIN: [
        "Clamp the input into the function's domain: sqrt(x.clamp_min(0)), acos(x.clamp(-1 + eps, 1 - eps)).",
        "A fractional power of a negative number is NaN: use x.abs() or a sign-preserving form.",
        "At a pole (atanh(+-1), lgamma(0), erfinv(+-1)) the value is infinite in any precision: keep the input "
        "strictly inside the domain.",
    ],
    Cause.GRAD_AT_SINGULARITY: [
        "Keep the forward away from the singular point: sqrt(x + eps) or sqrt(x.clamp_min(eps)) instead of "
        "sqrt(x); for distances use torch.cdist on x, or add eps inside the norm.",
        "If the singular entries are masked out of the loss (e.g. a distance matrix's diagonal), mask them "
        "before the sqrt/norm: 0 * inf is still NaN.",
    ],
    Cause.OVERFLOW: [
        "If the weights grew, lower the learning rate or clip gradients (--max-grad-norm); else check the "
        "initialisation.",
        "Run the op in float32 (autocast excludes it, or .float()) or use --precision bf16, whose range is fp32's.",
        "Normalise before the op (LayerNorm, scaled dot products / sqrt(d)); use logsumexp instead of exp().sum().",
    ],
    Cause.INF_ARITHMETIC: [
        "An Inf reached arithmetic (inf - inf, 0 * inf, inf / inf): find where the Inf came from and stop it there.",
        "For masks, use a large finite negative (torch.finfo(dtype).min / 2) instead of -inf if rows can be empty.",
    ],
    Cause.INFEASIBLE_TARGET: [
        "The target has probability 0 under the model: for CTC, every input must be at least as long as its "
        "target plus its repeated labels; drop or truncate the samples that are not, or pass zero_infinity=True.",
        "Check the lengths and the target encoding (blank index, padding values) of the samples named above.",
    ],
    Cause.MASKED_VALUE_USED: [
        "A value the mask excluded was still used: a target or an action on a masked position, or a sum over "
        "masked scores. Select after masking only where the mask allows, or mask the loss terms too.",
        "Use a large finite negative (torch.finfo(dtype).min / 2) instead of -inf for the mask value.",
    ],
    Cause.NONFINITE_INPUT: [
        "Filter or repair the data: the batch itself holds NaN/Inf before the model sees it.",
        "Check the preprocessing that produced this tensor (division by zero totals, log of zero, missing values).",
    ],
    Cause.NONFINITE_PARAMETER: [
        "Lower the learning rate, add warmup, or clip gradients (--max-grad-norm).",
        "Check optimizer hyperparameters (eps too small, betas) and the gradient magnitudes in the history table.",
    ],
    Cause.GRADIENT_EXPLOSION: [
        "Lower the learning rate (e.g. 10x) or lengthen warmup; clip gradients with --max-grad-norm 1.0.",
        "Look at the parameter with the largest gradient in the history table: add normalisation around it.",
    ],
    Cause.UNKNOWN: [
        "Read the op, module and input statistics above; rerun with --trace-every-step for the layer trace.",
    ],
}
# every label of the micro-batch is ignore_index: the data is the problem; an epsilon would train on nothing, silently
ALL_IGNORED_SUGGESTIONS = [
    "Fix the data first: every label of this micro-batch is ignore_index, so it carries nothing to learn. Find why "
    "(a response template that never matches after tokenisation, prompts truncated past the answer, a collate "
    "that masks everything) and drop or repair such samples.",
    "Average over the labelled tokens of the whole step, not per micro-batch: sum the token losses and divide by "
    "the step's count of labels (the HF Trainer passes it as `num_items_in_batch`); a micro-batch without labels "
    "then adds 0 instead of 0/0, and a step without any is skipped on purpose.",
]
# only for an origin inside the built-in model (debug_nan.aam.model): advice in the built-in pipeline's own terms
BUILTIN_SUGGESTIONS = {
    Cause.ALL_MASKED_SOFTMAX: ["For the built-in AAM pipeline: run with --guards (the default)."],
}


def is_builtin(event: OpEvent) -> bool:
    """Did the origin happen in the built-in model (its module's class lives in debug_nan.aam.model)?"""
    return event.module_class.startswith(BUILTIN_MODEL_PACKAGE)


def suggestions_for(cause: str, event: OpEvent | None = None) -> list[str]:
    extra = BUILTIN_SUGGESTIONS.get(cause, []) if event is not None and is_builtin(event) else []
    out = list(SUGGESTIONS[cause]) + extra
    if cause == Cause.OVERFLOW and event is not None and _ran_wide(event):
        # it overflowed float32 (or float64) itself: float32 or bf16 (fp32's range) would not help
        out = [s for s in out if not s.startswith("Run the op in float32")]
    return out


def _ran_wide(event: OpEvent) -> bool:
    """The op computed in float32 or float64 (its floating outputs, else its inputs)."""
    tensors = [t for _, t in event.outputs if t.is_floating_point()] or \
        [t for _, t in event.inputs if t.is_floating_point()]
    return bool(tensors) and all(t.dtype in (torch.float32, torch.float64) for t in tensors)


def ranges(values: list[int]) -> str:
    """[1,2,3,7,9,10] -> '1..3, 7, 9..10'."""
    out, start, prev = [], None, None
    for v in sorted(values):
        if start is None:
            start = prev = v
        elif v == prev + 1:
            prev = v
        else:
            out.append(f"{start}..{prev}" if prev > start else str(start))
            start = prev = v
    if start is not None:
        out.append(f"{start}..{prev}" if prev > start else str(start))
    return ", ".join(out)


def batch_layout(batch) -> tuple[int | None, int | None, list[str] | None]:
    """(B, A, sample_ids) from a batch: B and A from its first tensor with >= 3 dims ([B, A, L]), else B from its
    first tensor with a dim."""
    ids = batch.get("sample_ids") if isinstance(batch, dict) else None
    b = a = None
    for _, t in flat_tensors(batch):
        if t.dim() >= 3:
            b, a = t.shape[0], t.shape[1]
            break
    if b is None:
        for _, t in flat_tensors(batch):
            if t.dim() >= 1:
                b = t.shape[0]
                break
    return b, a, (list(ids) if ids is not None else None)


def describe_rows(first_dim_index: torch.Tensor, n_first: int, batch, aam: bool = False) -> str:
    """Map indices into a tensor's first dim to samples: a first dim of B x A (a batch [B, A, ...] flattened) to
    positions within samples ("ASV slots" when `aam`), a first dim of B to samples, anything else to rows."""
    b, a, ids = batch_layout(batch) if batch is not None else (None, None, None)
    idx = sorted(set(first_dim_index.tolist()))
    if b and a and n_first == b * a:
        per_sample: dict[int, list[int]] = {}
        for i in idx:
            per_sample.setdefault(i // a, []).append(i % a)
        parts = []
        for s, slots in list(per_sample.items())[:4]:
            name = ids[s] if ids else f"#{s}"
            if aam:
                parts.append(f"ASV slots {ranges(slots)} of sample {name} ({len(slots)} slots)")
            else:
                parts.append(f"positions {ranges(slots)} of sample {name} ({len(slots)} of {a} along dim 1)")
        more = f"; and {len(per_sample) - 4} more samples" if len(per_sample) > 4 else ""
        return "; ".join(parts) + more
    if b and n_first == b:
        names = [ids[i] if ids else f"#{i}" for i in idx]
        return f"samples {', '.join(names[:8])}" + (" ..." if len(names) > 8 else "")
    return f"rows {ranges(idx[:50])}" + (" ..." if len(idx) > 50 else "") + f" of dim 0 (size {n_first})"
