"""Masks: a softmax over a row whose every input is -inf, fused attention whose mask leaves a query without a
key, and a deliberate -inf (a mask value) that reached harm."""

from __future__ import annotations

import torch

from debug_nan.engine.explain.causes.wording import describe_rows, is_builtin
from debug_nan.engine.trace.events import OpEvent
from debug_nan.engine.vocabulary import Cause

SOFTMAX_OPS = {"_softmax", "softmax", "_log_softmax", "log_softmax", "_safe_softmax"}
# the mask's name in each attention schema: the composite op and the CPU kernel take `attn_mask`, the fused CUDA
# kernels (_scaled_dot_product_efficient_attention, _cudnn_, _fused_attention_overrideable) an additive `attn_bias`
MASK_ARGS = ("attn_mask", "attn_bias")


def is_attention(name: str) -> bool:
    return name.startswith("_scaled_dot_product") or name in (
        "scaled_dot_product_attention", "_flash_attention_forward", "_efficient_attention_forward")


def first_input(event: OpEvent, name: str = "self") -> torch.Tensor | None:
    for n, t in event.inputs:
        if n == name:
            return t
    return event.inputs[0][1] if event.inputs else None


def softmax_rule(event: OpEvent, batch) -> tuple[str, str] | None:
    x = first_input(event)
    if x is None or not x.is_floating_point():
        return None
    x = x.movedim(event.scalars.get("dim", -1), -1)
    masked = torch.isneginf(x).all(dim=-1)
    n_rows = int(masked.sum())
    if n_rows == 0 or masked.dim() == 0:
        return None
    where = masked.reshape(masked.shape[0], -1).any(dim=1).nonzero().squeeze(1)
    aam = is_builtin(event)
    evidence = (f"{event.op} over {n_rows} of {masked.numel()} rows whose {x.shape[-1]} inputs were all -inf "
                f"(every key masked), and softmax of an all -inf row is 0/0 = NaN. Those rows belong to "
                f"{describe_rows(where, masked.shape[0], batch, aam=aam)}")
    if aam and isinstance(batch, dict) and "tokens" in batch:
        evidence += ", which are all padding (token 0) after the token-limited collate."
    else:
        evidence += "."
    return Cause.ALL_MASKED_SOFTMAX, evidence


def attention_rule(event: OpEvent, batch) -> tuple[str, str] | None:
    """Fused attention: a query row whose mask masks every key (a bool mask all False, or a float mask/bias all
    -inf)."""
    named = dict(event.inputs)
    arg = next((a for a in MASK_ARGS if a in named), None)
    if arg is None:
        return None
    mask = named[arg]
    blocked = ~mask if mask.dtype == torch.bool else torch.isneginf(mask)
    query = named.get("query")
    if query is not None:  # count query rows as the kernel sees them: the mask broadcasts over batch and heads
        try:
            blocked = blocked.expand(torch.broadcast_shapes(blocked.shape, (*query.shape[:-1], blocked.shape[-1])))
        except RuntimeError:
            pass
    empty = blocked.all(dim=-1)  # [..., L_q]
    n_rows = int(empty.sum())
    if n_rows == 0:
        return None
    first = query.shape[0] if query is not None else empty.shape[0]
    rows = empty.reshape(empty.shape[0], -1).any(dim=1).nonzero().squeeze(1) if empty.dim() else None
    where = (describe_rows(rows, first, batch, aam=is_builtin(event))
             if rows is not None and empty.shape[0] == first else "some batch rows")
    return Cause.ALL_MASKED_SOFTMAX, (f"{event.op}: the attention mask `{arg}` {list(mask.shape)} leaves {n_rows} "
                                      "query "
                                  f"rows of {empty.numel()} with no key at all ({mask.shape[-1]} keys, every one "
                                  f"masked), and softmax over an empty set is 0/0 = NaN. Those rows belong to {where}.")


# torch's inference fast paths (nn.TransformerEncoderLayer / nn.MultiheadAttention under eval() + no_grad): their
# `mask` is True where a key is padding (src_key_padding_mask), the opposite of scaled_dot_product_attention's
FUSED_MASK_OPS = {"_transformer_encoder_layer_fwd": "nn.TransformerEncoderLayer's inference fast path",
                  "_native_multi_head_attention": "nn.MultiheadAttention's inference fast path",
                  "_masked_softmax": "the fused masked softmax of torch's attention fast path"}


def fused_mask_rule(event: OpEvent, batch) -> tuple[str, str] | None:
    """A fused fast-path op whose padding mask leaves a row with no key at all."""
    name = event.op.split(".")[1] if event.op.startswith("aten.") else event.op
    if name not in FUSED_MASK_OPS:
        return None
    mask = dict(event.inputs).get("mask")
    if mask is None or mask.dim() == 0:
        return None
    blocked = mask if mask.dtype == torch.bool else torch.isneginf(mask)
    empty = blocked.all(dim=-1)  # [B] for a key padding mask, [..., L_q] for an attention mask
    rows = empty.reshape(empty.shape[0], -1).any(dim=1).nonzero().squeeze(1) if empty.dim() else None
    if rows is None or rows.numel() == 0:
        return None
    where = describe_rows(rows, empty.shape[0], batch, aam=is_builtin(event))
    return Cause.ALL_MASKED_SOFTMAX, (f"{event.op} ({FUSED_MASK_OPS[name]}, taken only under eval() + no_grad): its "
                                  f"padding mask {list(mask.shape)} masks every one of the {mask.shape[-1]} keys "
                                  f"of {rows.numel()} rows of {empty.shape[0]}, and the fused kernel's softmax over "
                                  f"an empty set is 0/0 = NaN (training mode runs the composite path, whose softmax "
                                  f"gives such rows zero weights, so training stayed finite). Those all-padding rows "
                                  "belong to "
                                  f"{where}.")


def deliberate_rule(event: OpEvent) -> tuple[str, str] | None:
    """An Inf written on purpose (a mask) that is itself the origin of the harm: nothing else made an Inf."""
    if not event.deliberate:
        return None
    what = event.label or f"`{event.op}`"
    n = sum(int(torch.isinf(t).sum()) for _, t in event.outputs if t.is_floating_point() or t.is_complex())
    count = f" ({n} Inf values)" if event.outputs else ""
    return Cause.MASKED_VALUE_USED, (f"The Inf that {what} wrote on purpose{count}, a mask value, reached the harmed "
                                 f"value itself: no op overflowed or divided by zero; a value the mask excluded was "
                                 f"still used downstream (a target or an action on a masked position, a sum or "
                                 f"product over masked scores).")
