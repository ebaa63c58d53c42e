"""Tier 3, diagnosis: name the cause of an origin from the op and its input statistics.

The rules live in engine/explain/causes/ (masks, arithmetic, reductions, backward); this module runs them in order and
adds what the provenance knows (the Inf origins behind a NaN). Each rule returns (cause, evidence in plain words);
suggestions come from the cause. Wording is the AAM's (samples and ASV slots, the token-limited collate,
--guards) only when the origin ran in the built-in model, neutral for a user's own task.
"""

from __future__ import annotations

import torch

from debug_nan.engine.explain.causes.arithmetic import (
    division_rule,
    domain_rule,
    float64,
    inf_arithmetic_rule,
    infinite_rule,
    log_rule,
)
from debug_nan.engine.explain.causes.backward import singular_rule
from debug_nan.engine.explain.causes.masking import (
    SOFTMAX_OPS,
    attention_rule,
    deliberate_rule,
    fused_mask_rule,
    is_attention,
    softmax_rule,
)
from debug_nan.engine.explain.causes.precision import low_precision
from debug_nan.engine.explain.causes.principles import nan_from_finite_rule
from debug_nan.engine.explain.causes.reductions import ctc_rule, zero_count_rule
from debug_nan.engine.explain.causes.wording import (
    ALL_IGNORED_SUGGESTIONS,
    SUGGESTIONS,
    batch_layout,
    describe_rows,
    is_builtin,
    ranges,
    suggestions_for,
)
from debug_nan.engine.stats import tensor_stats
from debug_nan.engine.trace.events import OpEvent
from debug_nan.engine.vocabulary import Cause, Phase

__all__ = ["SUGGESTIONS", "base_name", "batch_layout", "describe_rows", "diagnose", "is_builtin", "ranges"]


def base_name(op: str) -> str:
    """'aten._softmax.default' -> '_softmax'."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else parts[0]


def diagnose(event: OpEvent, batch=None) -> tuple[str, str, list[str]]:
    """(cause code, explanation with evidence, suggestions) for an origin. A rule that fails on an unusual op
    falls back to `unknown` with the input statistics: the finding itself is never lost."""
    try:
        cause, explanation = _classify(event, batch)
    except Exception as exc:  # noqa: BLE001 - diagnosis is best effort, the origin stands regardless
        cause = Cause.UNKNOWN
        explanation = f"{event.op or event.label} produced {event.kind.upper()} (diagnosis failed: {exc})."
    if event.phase == Phase.OPTIMIZER:
        cause = Cause.NONFINITE_PARAMETER
    if event.note:
        explanation += f" ({event.note})"
    suggestions = suggestions_for(cause, event)
    if cause == Cause.DIV_BY_ZERO and "targets equals ignore_index" in explanation:  # (reductions._nll_rule)
        suggestions = ALL_IGNORED_SUGGESTIONS + [s for s in suggestions if s.startswith("Check for empty groups")]
    explanation, suggestions = low_precision(event, cause, explanation, suggestions)  # (float16 / bfloat16)
    source = _inf_source(event)
    if cause == Cause.INF_ARITHMETIC and source is not None:  # the fix belongs where the Inf was born
        try:
            suggestions += [s for s in suggestions_for(_classify(source, batch)[0], source) if s not in suggestions]
        except Exception:  # noqa: BLE001 - suggestions are a courtesy
            pass
    return cause, explanation, suggestions


def _inf_source(event: OpEvent) -> OpEvent | None:
    """The Inf origin behind a NaN origin: the earliest one not written on purpose, else the earliest mask."""
    real = [e for e in event.inf_sources if not e.deliberate]
    return (real or event.inf_sources or [None])[0]


def _classify(event: OpEvent, batch) -> tuple[str, str]:
    if event.label is not None:
        return _pre_existing(event)
    result = deliberate_rule(event)
    if result is not None:
        return result
    name = base_name(event.op)
    if not event.inputs and not event.outputs:  # an origin past the tracer's limit: no tensors kept
        return Cause.UNKNOWN, f"{event.op} produced {event.kind.upper()}."
    # a NaN made from Infs (0 * inf in a backward formula, inf - inf) is arithmetic on an Inf born upstream,
    # whatever the op; the Inf's own origin is named in the explanation
    result = None if _inf_inputs(event) else singular_rule(event)
    if result is None and name in SOFTMAX_OPS:
        result = softmax_rule(event, batch)
    elif result is None and is_attention(name):
        result = attention_rule(event, batch)
    if result is None:
        result = fused_mask_rule(event, batch)
    for rule in (zero_count_rule, ctc_rule, log_rule, division_rule, domain_rule):
        if result is None:
            result = rule(event, name)
    if result is None:
        result = inf_arithmetic_rule(event)
        if result is not None:
            result = (result[0], result[1] + _inf_source_sentence(event, batch))
    if result is None:
        result = infinite_rule(event, name)
    if result is None:
        result = nan_from_finite_rule(event, name, float64(event))
    if result is None:
        stats = "; ".join(f"{n}: {tensor_stats(t).line()}" for n, t in event.inputs[:3])
        result = (Cause.UNKNOWN, f"{event.op} produced {event.kind.upper()} from finite inputs ({stats})."
                  + _inf_source_sentence(event, batch))
    return result


def _inf_inputs(event: OpEvent) -> bool:
    return any((t.is_floating_point() or t.is_complex()) and bool(torch.isinf(t).any()) for _, t in event.inputs)


def _pre_existing(event: OpEvent) -> tuple[str, str]:
    """A tensor that was non-finite before the traced code used it: a batch tensor, a parameter, a buffer, a
    constant."""
    t = event.outputs[0][1] if event.outputs else None
    counts = ""
    if isinstance(t, torch.Tensor):
        s = tensor_stats(t)
        counts = f" {list(t.shape)} holds {s.nan} NaN, {s.posinf} +Inf and {s.neginf} -Inf of {s.numel} values"
    where = f" (first used at {event.source})" if event.source else ""
    if event.phase == Phase.DATA:
        return Cause.NONFINITE_INPUT, (f"The batch itself is non-finite before the model sees it: "
                                       f"{event.label}{counts}, "
                                   f"and that value reached the harm.")
    if event.label.startswith(("parameter", "buffer")) or event.phase == Phase.OPTIMIZER:
        return Cause.NONFINITE_PARAMETER, (f"{event.label}{counts} was already non-finite when this micro-batch began "
                                       f"(an earlier step wrote it){where}.")
    if event.deliberate:
        return Cause.MASKED_VALUE_USED, (f"{event.label}{counts}: a constant Inf (a mask value) reached the harmed "
                                     f"value{where}; a value the mask excluded was still used downstream.")
    return Cause.NONFINITE_INPUT, f"{event.label}{counts} was non-finite before the traced code used it{where}."


def _inf_source_sentence(event: OpEvent, batch) -> str:
    """' The Inf came from ...' for a NaN origin fed by Infs of known origin, with that origin's own cause."""
    src = _inf_source(event)
    if src is None:
        return ""
    where = ", ".join(p for p in (src.phase, f"module `{src.module}`" if src.module else "", src.source or "") if p)
    try:
        _, why = _classify(src, batch)
    except Exception:  # noqa: BLE001 - the sentence is a courtesy; the finding stands without it
        why = ""
    more = f" ({len(event.inf_sources) - 1} more Inf origins fed it)" if len(event.inf_sources) > 1 else ""
    return f" The Inf came from {src.op or src.label} ({where}){more}: {why}"
