"""Low precision: the evidence and advice of an overflow born in float16 or bfloat16 (autocast's dtypes).

An op that autocast runs in float16 (a matmul, a linear, a conv) overflows at 65504, far below float32's 3.4e38:
the evidence is the dtype, its limit, what the result needed (the op recomputed in float64) and how much headroom
its inputs had (the limit over their largest |x|: a large headroom in, none out, is the op's own growth). The
advice is in those terms: scale what grows (attention scores by 1/sqrt(d)), compute that op in float32 (autocast off
around its line, its inputs cast up: where the cast to float16 sits), or bf16, whose range is float32's.
"""

from __future__ import annotations

import math

import torch

from debug_nan.engine.explain.causes.arithmetic import float64
from debug_nan.engine.trace.events import OpEvent
from debug_nan.engine.vocabulary import Cause

LOW = (torch.float16, torch.bfloat16)
PRODUCTS = ("mm", "bmm", "matmul", "addmm", "baddbmm", "addbmm", "einsum", "linear", "_scaled_mm")


def low_dtype(event: OpEvent) -> torch.dtype | None:
    """float16 or bfloat16 where the op's floating result is in one of them, else None."""
    outs = [t for _, t in event.outputs if t.is_floating_point()]
    return outs[0].dtype if outs and outs[0].dtype in LOW else None


def low_precision(event: OpEvent, cause: str, explanation: str, suggestions: list[str]
                  ) -> tuple[str, list[str]]:
    """(explanation, suggestions) of an overflow born in float16 / bfloat16, with the dtype's evidence and advice;
    any other origin's unchanged."""
    dtype = low_dtype(event)
    if cause != Cause.OVERFLOW or dtype is None:
        return explanation, suggestions
    name, limit = str(dtype).replace("torch.", ""), torch.finfo(dtype).max
    ref = float64(event)
    needed = float(ref.abs().max()) if isinstance(ref, torch.Tensor) and ref.numel() else math.nan
    largest = max((float(t.detach().abs().max()) for _, t in event.inputs if t.is_floating_point() and t.numel()),
                  default=0.0)
    past = f", {needed / limit:.3g}x past it" if math.isfinite(needed) and needed > limit else ""
    headroom = (f"; its inputs had {limit / largest:.3g}x headroom in {name} (largest |input| {largest:.4g}), so "
                f"the op itself left the range" if largest > 0 and limit / largest > 1 else "")
    explanation += (f" Low precision: {name} result beyond {limit:.6g} (the result needs "
                    f"{needed:.4g}{past}){headroom}.") if math.isfinite(needed) else \
        f" Low precision: {name} result beyond {limit:.6g}{headroom}."
    if dtype == torch.bfloat16:  # float32's range: float32 would overflow too, the generic advice stands
        return explanation, suggestions
    device = next((t.device.type for _, t in event.outputs), "cuda")
    line = f" at {event.source}" if event.source else ""
    stem = event.op.split(".")[1] if event.op.startswith("aten.") else event.op
    advice = []
    if stem in PRODUCTS:
        advice.append(f"Scale what grows before it leaves float16's range: for attention scores, q @ k^T / sqrt(d) "
                      f"(or F.scaled_dot_product_attention, which scales them); normalise the inputs of this "
                      f"{stem}{line} (LayerNorm) so that their products stay far below 65504.")
    advice.append(f"Compute this op in float32: `with torch.autocast(\"{device}\", enabled=False):` around the "
                  f"line{line}, with its inputs cast up (`.float()`): that is where the cast to float16 sits "
                  f"(autocast runs {stem} in float16; or a .half() of the model or its inputs).")
    advice.append("Train in bfloat16 instead (--precision bf16): float32's range (3.4e38), so no overflow at 65504 "
                  "and no GradScaler needed.")
    rest = [s for s in suggestions if not s.startswith("Run the op in float32")]
    return explanation, advice + rest
