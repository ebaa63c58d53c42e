"""Elementwise arithmetic: logs of 0, divisions by 0, inputs outside a function's domain or on its pole,
arithmetic on infinities, and Infs that are (or are not) overflows."""

from __future__ import annotations

import torch
from torch.utils._pytree import tree_flatten, tree_map

from debug_nan.engine.explain.causes.masking import first_input
from debug_nan.engine.explain.causes.principles import has_no_pole, magnitude
from debug_nan.engine.trace.events import OpEvent, base_arg_name, named_tensors, op_info
from debug_nan.engine.vocabulary import Cause

# op -> the argument that is the log's argument (xlogy(x, y) = x * log(y))
LOG_OPS = {"log": "self", "log_": "self", "log2": "self", "log2_": "self", "log10": "self", "log10_": "self",
           "log1p": "self", "log1p_": "self", "_foreach_log": "self[0]", "_foreach_log_": "self[0]",
           "xlogy": "other", "xlogy_": "other", "special_xlogy": "other", "special_xlog1py": "other"}
DIV_OPS = {"div", "div_", "true_divide", "true_divide_", "reciprocal", "reciprocal_", "remainder", "remainder_",
           "fmod", "fmod_", "floor_divide", "floor_divide_", "_foreach_div", "_foreach_div_", "_foreach_reciprocal"}
DOMAIN_OPS = {"sqrt", "sqrt_", "rsqrt", "rsqrt_", "acos", "acos_", "asin", "asin_", "acosh", "acosh_", "atanh",
              "atanh_", "pow", "pow_", "lgamma", "digamma", "polygamma", "_foreach_sqrt", "_foreach_sqrt_",
              "_foreach_pow", "erfinv", "erfinv_", "logit", "logit_"}
# functions that are infinite at some finite inputs, in any precision
POLES = {"atanh": "atanh(x) is infinite at x = +-1", "erfinv": "erfinv(x) is infinite at x = +-1",
         "lgamma": "lgamma(x) is infinite at x = 0 and at the negative integers",
         "digamma": "digamma(x) is infinite at x = 0 and at the negative integers",
         "polygamma": "polygamma(n, x) is infinite at x = 0 and at the negative integers",
         "logit": "logit(p) = log(p / (1 - p)) is infinite at p = 0 and p = 1",
         "tan": "tan(x) is infinite at odd multiples of pi/2"}


def _count(mask: torch.Tensor) -> int:
    return int(mask.sum())


def _named(event: OpEvent, name: str) -> torch.Tensor | None:
    return dict(event.inputs).get(name)


def _stem(name: str) -> str:
    """'atanh_' -> 'atanh', '_foreach_sqrt_' -> 'sqrt', 'special_xlogy' -> 'xlogy'."""
    for prefix in ("_foreach_", "special_"):
        if name.startswith(prefix):
            name = name[len(prefix):]
    return name.rstrip("_")


def log_rule(event: OpEvent, name: str) -> tuple[str, str] | None:
    if name not in LOG_OPS:
        return None
    x = _named(event, LOG_OPS[name]) if LOG_OPS[name] != "self" else first_input(event)
    if x is None or not (x.is_floating_point() or x.is_complex()):
        return None
    low = -1.0 if _stem(name) in ("log1p", "xlog1py") else 0.0
    zeros = _count(x == low)
    neg = _count(x < low) if x.is_floating_point() else 0
    if not (zeros or neg):
        return None
    finite = x[torch.isfinite(x)] if x.is_floating_point() else None
    smallest = f"; smallest input {float(finite.min()):.4g}" if finite is not None and finite.numel() else ""
    return Cause.LOG_OF_NONPOSITIVE, (f"{event.op} of {zeros} values equal to {low:g} (-> -inf) and {neg} below it "
                                  f"(-> NaN) out of {x.numel()}{smallest}.")


def division_rule(event: OpEvent, name: str) -> tuple[str, str] | None:
    if name.startswith(("addcdiv", "_foreach_addcdiv")) and len(event.inputs) >= 3:
        den = event.inputs[2][1]
        zeros = _count(den == 0)
        if zeros:
            num = event.inputs[1][1]
            both = _count((den == 0) & (num == 0)) if num.shape == den.shape else 0
            return Cause.DIV_BY_ZERO, (f"{event.op}: the denominator `{event.inputs[2][0]}` is exactly 0 at {zeros} of "
                                   f"{den.numel()} positions ({both} of them 0/0 = NaN).")
        return None
    if name not in DIV_OPS:
        return None
    x = first_input(event)
    if name.startswith(("reciprocal", "_foreach_reciprocal")):
        den, num = x, None
    elif len(event.inputs) > 1:
        den, num = event.inputs[1][1], x
    elif isinstance(event.scalars.get("other"), (int, float, complex)):  # x / 0 with a Python number
        if event.scalars["other"] != 0 or x is None:
            return None
        zero_num = _count(x == 0)
        return Cause.DIV_BY_ZERO, (f"{event.op}: division of {x.numel()} values by the number 0 ({zero_num} of them "
                               f"0/0 = NaN, the rest x/0 = +-inf).")
    else:
        return None
    if den is None:
        return None
    zeros = _count(den == 0)
    if not zeros:
        return None
    both = _count((den == 0) & (num == 0)) if num is not None and num.shape == den.shape else None
    extra = f" ({both} of them 0/0 = NaN, the rest x/0 = +-inf)" if both is not None else ""
    return Cause.DIV_BY_ZERO, (f"{event.op}: the denominator {list(den.shape)} is exactly 0 at {zeros} of "
                           f"{den.numel()} positions{extra}.")


def domain_rule(event: OpEvent, name: str) -> tuple[str, str] | None:
    if name not in DOMAIN_OPS:
        return None
    x = first_input(event)
    if x is None or not x.is_floating_point():
        return None
    stem = _stem(name)
    exponent = event.scalars.get("exponent")
    if stem == "pow" and exponent is not None and float(exponent) == int(float(exponent)):
        return None  # an integer power is defined everywhere (0 ** -n is a division, below)
    if stem in ("acos", "asin", "atanh", "erfinv"):
        bad, where = _count(x.abs() > 1), "|x| > 1"
    elif stem == "acosh":
        bad, where = _count(x < 1), "x < 1"
    elif stem == "logit":
        bad, where = _count((x < 0) | (x > 1)), "x outside [0, 1]"
    elif stem in ("lgamma", "digamma", "polygamma"):
        bad, where = 0, ""
    else:
        bad, where = _count(x < 0), "x < 0"
    if bad:
        return Cause.INVALID_DOMAIN, (f"{event.op} of {bad} of {x.numel()} inputs outside its domain ({where}); "
                                  f"input range {float(x.min()):.4g}..{float(x.max()):.4g}.")
    if stem in ("rsqrt", "pow") and _count(x == 0):
        return Cause.DIV_BY_ZERO, f"{event.op} of {_count(x == 0)} zeros: a negative power of 0 is infinite."
    return None


def inf_arithmetic_rule(event: OpEvent) -> tuple[str, str] | None:
    """A NaN made from inputs that already held infinities."""
    if event.kind != "nan":
        return None
    infs = [f"{n} holds {_count(torch.isinf(t))} Inf" for n, t in event.inputs
            if (t.is_floating_point() or t.is_complex()) and bool(torch.isinf(t).any())]
    if not infs:
        return None
    within = f" (in {event.backward_node})" if event.backward_node else ""
    return Cause.INF_ARITHMETIC, (f"{event.op}{within} made NaN from inputs that already held infinities "
                              f"({'; '.join(infs)}): "
                              f"inf - inf, 0 * inf and inf / inf are NaN.")


def float64_outputs(event: OpEvent) -> list[torch.Tensor] | None:
    """The op recomputed in float64 (complex128): its tensors in the order of event.outputs (the returned ones,
    then the arguments it writes that it does not return: BatchNorm's running_var), or None where it cannot be
    (some ops refuse float64)."""
    if event.func is None:
        return None
    copies: dict[int, torch.Tensor] = {}

    def up(v):
        if isinstance(v, torch.Tensor) and (v.is_floating_point() or v.is_complex()):
            if id(v) not in copies:
                # (a copy even of a float64 tensor: an in-place op recomputed must not write the evidence)
                copies[id(v)] = v.detach().to(torch.complex128 if v.is_complex() else torch.float64, copy=True)
            return copies[id(v)]
        return v
    args, kwargs = tree_map(up, event.args), tree_map(up, event.kwargs)
    try:
        with torch.no_grad():
            ref = event.func(*args, **kwargs)
    except Exception:  # noqa: BLE001 - a courtesy only: some ops refuse float64 or mixed dtypes
        return None
    outs = [t for t in tree_flatten(ref)[0] if isinstance(t, torch.Tensor)]
    tensors, _ = named_tensors(event.func, args, kwargs)
    written = op_info(event.func).written
    for name, t in tensors:  # (in the tracer's order: each written argument the op did not return, once)
        if base_arg_name(name) in written and all(t is not o for o in outs):
            outs.append(t)
    return outs


def float64(event: OpEvent) -> torch.Tensor | None:
    """The op's first result recomputed in float64 (float64_outputs), or None."""
    outs = float64_outputs(event)
    return outs[0] if outs else None


def infinite_rule(event: OpEvent, name: str) -> tuple[str, str] | None:
    """An Inf from finite inputs: an overflow of the dtype when float64 gives a finite value; otherwise the value
    is infinite by definition (a pole), which no precision cures."""
    if event.kind != "inf":
        return None
    pairs = _infinite_outputs(event, name)
    if not pairs:
        return None
    dtype = pairs[0][0].dtype
    n_inf = sum(_count(torch.isinf(t)) for t, _ in pairs)
    refs = [r for _, r in pairs if r is not None]
    ref = torch.cat([r.detach().reshape(-1) for r in refs]) if refs and len(refs) == len(pairs) else None
    if ref is not None and (ref.is_floating_point() or ref.is_complex()) and bool(torch.isinf(ref).any()):
        n_ref = _count(torch.isinf(ref))
        stem = _stem(name)
        if stem in POLES:
            return Cause.INVALID_DOMAIN, (f"{event.op} made {n_inf} Inf values from finite inputs, and recomputed in "
                                      f"float64 {n_ref} are still Inf: not an overflow but a pole, {POLES[stem]}.")
        if has_no_pole(name, event):  # finite at every finite input: the value is merely too large for float64 too
            return Cause.OVERFLOW, (f"{event.op} turned finite inputs into {n_inf} Inf values, and recomputed in "
                                    "float64 "
                                f"{n_ref} are still Inf: {stem} has no pole at finite inputs, so this is an "
                                f"overflow past float64's range as well{magnitude(name, event)}.")
        return Cause.UNKNOWN, (f"{event.op} made {n_inf} Inf values from finite inputs, and recomputed in float64 "
                               f"{n_ref} "
                           f"are still Inf: not an overflow of {str(dtype).replace('torch.', '')} but a value that is "
                           f"infinite at these inputs in any precision.")
    real_dtype = torch.empty(0, dtype=dtype).real.dtype
    limit = torch.finfo(real_dtype).max
    in_max = max((float(t.detach().abs().max()) for _, t in event.inputs
                  if (t.is_floating_point() or t.is_complex()) and t.numel()), default=0.0)
    written = _written_names(event, pairs)
    reference = (f"; recomputed in float64 the largest |result|{written} is {float(ref.abs().max()):.4g}"
                 if ref is not None and ref.numel() else "")
    if ref is not None and ref.numel() and float(ref.abs().max()) <= limit:  # the result fits: a partial sum did not
        return Cause.OVERFLOW, (f"{event.op} turned finite inputs (largest |input| {in_max:.4g}) into {n_inf} Inf "
                                "values: "
                            f"an intermediate (a partial sum or product) exceeded the "
                            f"{str(dtype).replace('torch.', '')} maximum {limit:.6g}, although the exact result "
                            f"fits ({float(ref.abs().max()):.4g} recomputed in float64): accumulating in "
                            f"{str(dtype).replace('torch.', '')} overflowed.")
    return Cause.OVERFLOW, (f"{event.op} turned finite inputs (largest |input| {in_max:.4g}) into {n_inf} Inf values: "
                        f"the result exceeds the {str(dtype).replace('torch.', '')} maximum {limit:.6g}{reference}.")



def _infinite_outputs(event: OpEvent, name: str) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
    """(output that holds an Inf, its float64 recomputation at the same positions or None) for each floating
    output holding an Inf: the evidence is the Inf's own output (BatchNorm's running_var ~1e60), never another
    output of the op that stayed finite."""
    refs = float64_outputs(event) if name != "_to_copy" else None
    out = []
    for i, (_, t) in enumerate(event.outputs):
        if not (t.is_floating_point() or t.is_complex()) or not bool(torch.isinf(t).any()):
            continue
        ref = refs[i] if refs is not None and i < len(refs) and refs[i].shape == t.shape else None
        out.append((t, ref[torch.isinf(t)] if ref is not None else None))
    return out


def _written_names(event: OpEvent, pairs) -> str:
    """' of `running_var`' where the Infs are in arguments the op wrote without returning them."""
    held = {id(t) for t, _ in pairs}
    names = [n for n, t in event.outputs if id(t) in held and not n.startswith("out")]
    return f" of `{'`, `'.join(names)}`" if names else ""
