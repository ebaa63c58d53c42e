"""Tier 3, diagnosis: name the cause of an op-level origin from the op and its input statistics.

Each rule returns (cause, evidence in plain words); suggestions come from the cause. Row evidence (which samples
and ASV slots a fully masked softmax row belongs to) uses the AAM layout convention: a tensor whose first dim is
B x A (samples x slots) or B is mapped back to sample IDs and slot ranges.
"""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_map

from debug_nan.checks.stats import flat_tensors, tensor_stats
from debug_nan.checks.tracer import OpEvent

SOFTMAX_OPS = {"_softmax", "softmax", "_log_softmax", "log_softmax", "_safe_softmax"}
LOG_OPS = {"log", "log2", "log10", "log1p", "log_", "xlogy", "special_xlog1py", "_foreach_log"}
DIV_OPS = {"div", "div_", "true_divide", "reciprocal", "reciprocal_", "remainder", "fmod", "floor_divide",
           "_foreach_div", "_foreach_div_", "_foreach_reciprocal"}
DOMAIN_OPS = {"sqrt", "sqrt_", "rsqrt", "acos", "asin", "acosh", "atanh", "pow", "pow_", "lgamma", "digamma",
              "_foreach_sqrt", "_foreach_sqrt_", "_foreach_pow", "erfinv"}
SINGULAR_BACKWARD = ("SqrtBackward", "RsqrtBackward", "PowBackward", "NormBackward", "LinalgVectorNormBackward",
                     "AcosBackward", "AsinBackward", "AtanhBackward", "CdistBackward", "LogBackward",
                     "Log2Backward", "Log10Backward", "ReciprocalBackward", "DivBackward", "AcoshBackward")
BACKWARD_FORMULA = {
    "Sqrt": "d/dx sqrt(x) = 1/(2 sqrt(x)) is infinite at x = 0",
    "Rsqrt": "d/dx x^-1/2 = -x^-3/2 / 2 is infinite at x = 0",
    "Pow": "d/dx x^p = p x^(p-1) is infinite at x = 0 for p < 1",
    "Norm": "the gradient of a norm, x / ||x||, is 0/0 where ||x|| = 0",
    "LinalgVectorNorm": "the gradient of a norm, x / ||x||, is 0/0 where ||x|| = 0",
    "Cdist": "the gradient of a Euclidean distance, (x - y) / d, is 0/0 where d = 0",
    "Acos": "d/dx acos(x) = -1/sqrt(1 - x^2) is infinite at |x| = 1",
    "Asin": "d/dx asin(x) = 1/sqrt(1 - x^2) is infinite at |x| = 1",
    "Atanh": "d/dx atanh(x) = 1/(1 - x^2) is infinite at |x| = 1",
    "Log": "d/dx log(x) = 1/x is infinite at x = 0",
}

SUGGESTIONS = {
    "all_masked_softmax": [
        "Guard rows with no valid key before the softmax (give them one key, or skip them), not after it: "
        "zeroing the output with torch.where still leaks NaN into the gradients.",
        "Drop all-padding rows before the encoder (pack the valid rows) or make the collate never emit empty rows.",
        "For the built-in AAM pipeline: run with --guards (the default).",
    ],
    "log_of_nonpositive": [
        "Clamp the argument: torch.log(x.clamp_min(eps)), or use log_softmax / logsumexp instead of log(softmax).",
        "Check why the value reached 0 or below (an underflowing probability, a zero count, a ReLU output).",
    ],
    "div_by_zero": [
        "Add an epsilon to the denominator or clamp it: x / (s + eps), x / s.clamp_min(eps).",
        "Check for empty groups: a sum over zero elements (masked row, empty sample) is 0.",
    ],
    "invalid_domain": [
        "Clamp the input into the function's domain: sqrt(x.clamp_min(0)), acos(x.clamp(-1 + eps, 1 - eps)).",
        "A fractional power of a negative number is NaN: use x.abs() or a sign-preserving form.",
    ],
    "grad_at_singularity": [
        "Keep the forward away from the singular point: sqrt(x + eps) or sqrt(x.clamp_min(eps)) instead of "
        "sqrt(x); for distances use torch.cdist on x, or add eps inside the norm.",
        "If the singular entries are masked out of the loss (e.g. a distance matrix's diagonal), mask them "
        "before the sqrt/norm: 0 * inf is still NaN.",
    ],
    "overflow": [
        "Lower the learning rate or clip gradients (--max-grad-norm) if weights grew; check initialisation.",
        "Run the op in float32 (autocast excludes it, or .float()) or use --precision bf16, whose range is fp32's.",
        "Normalise before the op (LayerNorm, scaled dot products / sqrt(d)); use logsumexp instead of exp().sum().",
    ],
    "inf_arithmetic": [
        "An Inf reached arithmetic (inf - inf, 0 * inf, inf / inf): find where the Inf came from and stop it there.",
        "For masks, use a large finite negative (torch.finfo(dtype).min / 2) instead of -inf if rows can be empty.",
    ],
    "nonfinite_input": [
        "Filter or repair the data: the batch itself holds NaN/Inf before the model sees it.",
        "Check the preprocessing that produced this key (division by zero totals, log of zero, missing values).",
    ],
    "nonfinite_parameter": [
        "Lower the learning rate, add warmup, or clip gradients (--max-grad-norm).",
        "Check optimizer hyperparameters (eps too small, betas) and the gradient magnitudes in the history table.",
    ],
    "gradient_explosion": [
        "Lower the learning rate (e.g. 10x) or lengthen warmup; clip gradients with --max-grad-norm 1.0.",
        "Look at the parameter with the largest gradient in the history table: add normalisation around it.",
    ],
    "unknown": [
        "Read the op, module and input statistics above; rerun with --trace-every-step for the layer trace.",
    ],
}


def base_name(op: str) -> str:
    """'aten._softmax.default' -> '_softmax'."""
    parts = op.split(".")
    return parts[1] if len(parts) >= 2 and parts[0] == "aten" else parts[0]


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
    """(B, A, sample_ids) from a batch: B and A from its first tensor with >= 3 dims (AAM tokens [B, A, L])."""
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


def describe_rows(first_dim_index: torch.Tensor, n_first: int, batch) -> str:
    """Map indices into a tensor's first dim to samples (and ASV slots when it is B x A)."""
    b, a, ids = batch_layout(batch) if batch is not None else (None, None, None)
    idx = sorted(set(first_dim_index.tolist()))
    if b and a and n_first == b * a:
        per_sample: dict[int, list[int]] = {}
        for i in idx:
            per_sample.setdefault(i // a, []).append(i % a)
        parts = []
        for s, slots in list(per_sample.items())[:4]:
            name = ids[s] if ids else f"#{s}"
            parts.append(f"ASV slots {ranges(slots)} of sample {name} ({len(slots)} slots)")
        more = f"; and {len(per_sample) - 4} more samples" if len(per_sample) > 4 else ""
        return "; ".join(parts) + more
    if b and n_first == b:
        names = [ids[i] if ids else f"#{i}" for i in idx]
        return f"samples {', '.join(names[:8])}" + (" ..." if len(names) > 8 else "")
    return f"rows {ranges(idx[:50])}" + (" ..." if len(idx) > 50 else "") + f" of dim 0 (size {n_first})"


def _input(event: OpEvent, name: str = "self") -> torch.Tensor | None:
    for n, t in event.inputs:
        if n == name:
            return t
    return event.inputs[0][1] if event.inputs else None


def _softmax_rule(event: OpEvent, batch) -> tuple[str, str] | None:
    x = _input(event)
    if x is None or not x.is_floating_point():
        return None
    dim = event.scalars.get("dim", -1)
    x = x.movedim(dim, -1)
    masked = torch.isneginf(x).all(dim=-1)
    n_rows = int(masked.sum())
    if n_rows == 0:
        return None
    where = masked.reshape(masked.shape[0], -1).any(dim=1).nonzero().squeeze(1)
    evidence = (f"{event.op} over {n_rows} of {masked.numel()} rows whose {x.shape[-1]} inputs were all -inf "
                f"(every key masked), and softmax of an all -inf row is 0/0 = NaN. Those rows belong to "
                f"{describe_rows(where, masked.shape[0], batch)}")
    if batch is not None and isinstance(batch, dict) and "tokens" in batch:
        evidence += ", which are all padding (token 0) after the token-limited collate."
    else:
        evidence += "."
    return "all_masked_softmax", evidence


def _sdpa_rule(event: OpEvent, batch) -> tuple[str, str] | None:
    """Fused attention: a query row whose attn_mask row masks every key (all False, or all -inf)."""
    mask = dict(event.inputs).get("attn_mask")
    if mask is None:
        return None
    blocked = ~mask if mask.dtype == torch.bool else torch.isneginf(mask)
    empty = blocked.all(dim=-1)  # [..., L_q]
    n_rows = int(empty.sum())
    if n_rows == 0:
        return None
    query = dict(event.inputs).get("query")
    first = query.shape[0] if query is not None else empty.shape[0]
    rows = empty.reshape(empty.shape[0], -1).any(dim=1).nonzero().squeeze(1) if empty.dim() else None
    where = describe_rows(rows, first, batch) if rows is not None and empty.shape[0] == first else \
        "some batch rows"
    return "all_masked_softmax", (f"{event.op}: the attention mask leaves {n_rows} query rows of {empty.numel()} "
                                  f"with no key at all ({mask.shape[-1]} keys, every one masked), and softmax over "
                                  f"an empty set is 0/0 = NaN. Those rows belong to {where}.")


def _count(mask: torch.Tensor) -> int:
    return int(mask.sum())


def _domain_rule(event: OpEvent, name: str) -> tuple[str, str] | None:
    x = _input(event)
    if x is None or not x.is_floating_point():
        return None
    if name in LOG_OPS or name.startswith("log"):
        low = -1.0 if name == "log1p" else 0.0
        zeros, neg = _count(x == low), _count(x < low)
        if zeros or neg:
            return "log_of_nonpositive", (
                f"{event.op} of {zeros} values equal to {low:g} (-> -inf) and {neg} below it (-> NaN) out of "
                f"{x.numel()}; smallest input {float(x[torch.isfinite(x)].min()) if torch.isfinite(x).any() else float('nan'):.4g}.")
    if name.startswith(("addcdiv", "_foreach_addcdiv")) and len(event.inputs) >= 3:
        den = event.inputs[2][1]
        zeros = _count(den == 0)
        if zeros:
            num = event.inputs[1][1]
            both = _count((den == 0) & (num == 0)) if num.shape == den.shape else 0
            return "div_by_zero", (f"{event.op}: the denominator `{event.inputs[2][0]}` is exactly 0 at {zeros} of "
                                   f"{den.numel()} positions ({both} of them 0/0 = NaN).")
    if name in DIV_OPS:
        den = event.inputs[1][1] if len(event.inputs) > 1 else x
        if name.startswith("reciprocal"):
            den = x
        zeros = _count(den == 0)
        if zeros:
            num = x if len(event.inputs) > 1 else None
            both = _count((den == 0) & (num == 0)) if num is not None and num.shape == den.shape else None
            extra = f" ({both} of them 0/0 = NaN, the rest x/0 = +-inf)" if both is not None else ""
            return "div_by_zero", (f"{event.op}: the denominator {list(den.shape)} is exactly 0 at {zeros} of "
                                   f"{den.numel()} positions{extra}.")
    if name in DOMAIN_OPS:
        exponent = event.scalars.get("exponent")
        if name.startswith("pow") and exponent is not None and float(exponent) == int(float(exponent)):
            return None
        if name in ("acos", "asin", "atanh"):
            bad = _count(x.abs() > 1)
            where = "|x| > 1"
        elif name == "acosh":
            bad, where = _count(x < 1), "x < 1"
        else:
            bad, where = _count(x < 0), "x < 0"
        if bad:
            return "invalid_domain", (f"{event.op} of {bad} of {x.numel()} inputs outside its domain ({where}); "
                                      f"input range {float(x.min()):.4g}..{float(x.max()):.4g}.")
        if name in ("rsqrt", "pow") and _count(x == 0):
            return "div_by_zero", f"{event.op} of {_count(x == 0)} zeros: a negative power of 0 is infinite."
    return None


def _singular_rule(event: OpEvent) -> tuple[str, str] | None:
    node_name = event.backward_node or ""
    if not node_name.startswith(SINGULAR_BACKWARD):
        return None
    fn = node_name.split("Backward")[0]
    formula = BACKWARD_FORMULA.get(fn, f"the derivative of {fn.lower()} is infinite there")
    evidence = []
    for name in ("result", "self", "other"):
        saved = event.saved.get(name)
        if isinstance(saved, torch.Tensor) and saved.is_floating_point():
            zeros = _count(saved == 0)
            if zeros:
                evidence.append(f"its saved forward {name} is 0 at {zeros} of {saved.numel()} positions")
    at = f" (forward at {event.forward_source})" if event.forward_source else ""
    detail = "; ".join(evidence) if evidence else "its forward input sits on the singular point"
    return "grad_at_singularity", (f"Backward of {fn.lower()} ({node_name}{at}) produced {event.kind.upper()} while "
                                   f"every forward value was finite: {detail}; {formula}. The forward pass was finite.")


def _overflow_rule(event: OpEvent) -> tuple[str, str] | None:
    if event.kind != "inf":
        return None
    outs = [t for _, t in event.outputs if t.is_floating_point()]
    if not outs:
        return None
    dtype = outs[0].dtype
    limit = torch.finfo(dtype).max
    in_max = max((float(t.detach().abs().max()) for _, t in event.inputs if t.is_floating_point() and t.numel()),
                 default=0.0)
    n_inf = sum(_count(torch.isinf(t)) for t in outs)
    reference = ""
    if event.func is not None and base_name(event.op) != "_to_copy":
        try:  # the same op in float64: how large the result really is
            up = lambda v: v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v  # noqa: E731
            with torch.no_grad():
                ref = event.func(*tree_map(up, event.args), **tree_map(up, event.kwargs))
            ref = ref if isinstance(ref, torch.Tensor) else tree_flatten(ref)[0][0]
            reference = f"; recomputed in float64 the largest |result| is {float(ref.abs().max()):.4g}"
        except Exception:  # a courtesy only: some ops refuse float64 or mixed dtypes
            reference = ""
    return "overflow", (f"{event.op} turned finite inputs (largest |input| {in_max:.4g}) into {n_inf} Inf values: "
                        f"the result exceeds the {str(dtype).replace('torch.', '')} maximum {limit:.6g}{reference}.")


def diagnose(event: OpEvent, batch=None) -> tuple[str, str, list[str]]:
    """(cause code, explanation with evidence, suggestions) for an op-level origin. A rule that fails on an
    unusual op falls back to `unknown` with the input statistics: the finding itself is never lost."""
    try:
        cause, explanation = _classify(event, batch)
    except Exception as exc:  # noqa: BLE001 - diagnosis is best effort, the origin stands regardless
        cause, explanation = "unknown", f"{event.op} produced {event.kind.upper()} (diagnosis failed: {exc})."
    if event.phase == "optimizer":
        cause = "nonfinite_parameter"
    return cause, explanation, list(SUGGESTIONS[cause])


def _classify(event: OpEvent, batch) -> tuple[str, str]:
    name = base_name(event.op)
    result = None
    if event.phase == "backward":
        result = _singular_rule(event)
    if result is None and name in SOFTMAX_OPS:
        result = _softmax_rule(event, batch)
    if result is None and (name.startswith("_scaled_dot_product") or name == "scaled_dot_product_attention"):
        result = _sdpa_rule(event, batch)
    if result is None:
        result = _domain_rule(event, name)
    if result is None and event.kind == "nan" and any(bool(torch.isinf(t).any()) for _, t in event.inputs
                                                       if t.is_floating_point()):
        infs = [f"{n} holds {_count(torch.isinf(t))} Inf" for n, t in event.inputs
                if t.is_floating_point() and bool(torch.isinf(t).any())]
        result = ("inf_arithmetic", f"{event.op} made NaN from inputs that already held infinities ({'; '.join(infs)}): "
                                    f"inf - inf, 0 * inf and inf / inf are NaN.")
    if result is None:
        result = _overflow_rule(event)
    if result is None:
        stats = "; ".join(f"{n}: {tensor_stats(t).line()}" for n, t in event.inputs[:3])
        result = ("unknown", f"{event.op} produced {event.kind.upper()} from finite inputs ({stats}).")
    return result
