"""Causes decided by what an op can mathematically return at finite inputs, per op family.

An Inf from finite inputs is either an OVERFLOW (the true value is finite, or grows without bound with its input,
but exceeds the dtype: exp(1000) is about 10^434, beyond float64 too) or a POLE (the function is infinite at
that finite input: log 0, x / 0, atanh(1), the -log 0 of an impossible CTC alignment). Functions with no pole at
any finite input (exp, sinh, cosh, products, sums, matrix products, convolutions, powers with a non-negative
exponent) can only overflow, whatever float64 says; recomputing in float64 tells the rest apart.

A NaN from finite inputs is 0/0, inf - inf or 0 * inf inside the op, or an input outside the domain. An op no
rule lists still gets a cause from its inputs: a float64 recomputation that is finite means an intermediate
overflowed; an input with an all-zero slice (a zero weight row under weight norm, a zero vector normalised) is
the 0/0 of dividing by its norm.
"""

from __future__ import annotations

import math

import torch

from debug_nan.engine.trace.events import OpEvent
from debug_nan.engine.vocabulary import Cause

# no pole at any finite input: an Inf can only be an overflow (of the result or of an intermediate)
ENTIRE = {"exp", "exp2", "expm1", "sinh", "cosh", "mul", "add", "sub", "rsub", "addmm", "addmv", "addbmm",
          "baddbmm", "mm", "bmm", "matmul", "mv", "dot", "linear", "convolution", "_convolution", "sum", "cumsum",
          "prod", "cumprod", "square", "pow", "softplus", "logsumexp", "linalg_vector_norm", "norm", "var", "std",
          "mean", "einsum", "_softmax", "_log_softmax", "scaled_dot_product_attention", "lerp", "addcmul",
          "_foreach_mul", "_foreach_add", "_foreach_addcmul", "_foreach_exp", "_foreach_pow", "_to_copy"}
EXP_FAMILY = {"exp": math.e, "exp2": 2.0, "expm1": math.e, "sinh": math.e, "cosh": math.e, "_foreach_exp": math.e}


def stem(name: str) -> str:
    """'exp_' -> 'exp', '_foreach_exp_' -> '_foreach_exp'."""
    return name.rstrip("_") if not name.endswith("__") else name


def has_no_pole(name: str, event: OpEvent) -> bool:
    """Is the op finite at every finite input (pow only with a non-negative exponent)?"""
    s = stem(name)
    if s not in ENTIRE:
        return False
    if s in ("pow", "_foreach_pow"):
        exponent = event.scalars.get("exponent")
        tensors = dict(event.inputs)
        if isinstance(exponent, (int, float)):
            return exponent >= 0
        e = tensors.get("exponent")
        return e is not None and bool((e >= 0).all())
    return True


def magnitude(name: str, event: OpEvent) -> str:
    """For the exp family: the true size of the largest result, in powers of ten (exp(800) ~ 10^347)."""
    base = EXP_FAMILY.get(stem(name))
    if base is None or not event.inputs:
        return ""
    x = event.inputs[0][1]
    if not x.is_floating_point() or not x.numel():
        return ""
    largest = float(x.detach().abs().max())
    return f"; the true value at the largest input {largest:.4g} is about 10^{largest * math.log10(base):.0f}"


def zero_slices(t: torch.Tensor) -> tuple[int, int] | None:
    """(all-zero slices along dim 0, number of slices) of a floating tensor with >= 2 dims, or (1, 1) for an
    all-zero tensor; None when there are none."""
    if not t.is_floating_point() or t.numel() == 0:
        return None
    if not bool(t.any()):
        return 1, 1
    if t.dim() < 2:
        return None
    rows = t.detach().reshape(t.shape[0], -1).abs().amax(1) == 0
    n = int(rows.sum())
    return (n, t.shape[0]) if n else None


def nan_from_finite_rule(event: OpEvent, name: str, float64: torch.Tensor | None) -> tuple[str, str] | None:
    """A NaN from finite inputs in an op no other rule explains: by its inputs and a float64 recomputation."""
    if event.kind != "nan":
        return None
    out = next((t for _, t in event.outputs if t.is_floating_point() or t.is_complex()), None)
    if out is not None and float64 is not None and float64.shape == out.shape:
        at = torch.isnan(out)
        ref = float64[at] if not float64.is_complex() else torch.view_as_real(float64)[at]
        if ref.numel() and bool(torch.isfinite(ref).all()):
            return Cause.OVERFLOW, (f"{event.op} made {int(at.sum())} NaN from finite inputs, and recomputed in "
                                    "float64 "
                                f"the same positions are finite: an intermediate value overflowed "
                                f"{str(out.dtype).replace('torch.', '')} inside the op (inf - inf or 0 * inf).")
    for arg, t in event.inputs:
        zeros = zero_slices(t)
        if zeros is not None:
            n, of = zeros
            which = "is all zeros" if of == 1 and n == 1 else f"has {n} all-zero slices along dim 0 (of {of})"
            return Cause.DIV_BY_ZERO, (f"{event.op} made NaN from finite inputs, and its input `{arg}` {list(t.shape)} "
                                   f"{which}: normalising a zero vector by its norm (as weight norm does, "
                                   f"g * v / ||v||) is 0/0 = NaN.")
    return None
