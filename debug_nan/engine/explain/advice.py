"""The first advice follows the evidence: what the step number, the phase, the lineage and the statistics show.

The cause's suggestions (causes/wording.py) say what an op of that kind needs; which of them comes first, and
whether learning-rate advice belongs at all, is decided here from the run:
  * a masked row (the mask's causes): the mask, as the cause's own advice says;
  * a batch holding extreme values (beyond what float32 can square): the data, the sample and its value named;
  * an overflow born in float16 (autocast, .half()) whose float32 result fits: the precision (causes/precision.py
    puts its advice first: scale, compute in float32, bf16), not the updates;
  * a micro-batch before any update of this run: the initialisation or the checkpoint loaded, the largest
    parameter named with its magnitude; no learning rate can be the cause, so no such advice;
  * later, an overflow or a non-finite parameter: the weights grew by the updates: the learning rate, warmup,
    Adam's epsilon; clipping only where the run does not clip already (engine/watch/clipping.py);
  * an op no cause rule explains (`unknown`) whose finite inputs reach |x| >= 1e6 (GROWN: far beyond what a
    network's activations are at initialisation): the same two branches, by the step, the inputs' size named (a
    NaN from such inputs is float32's rounding, ~|x| * 6e-8 absolute, turned into Inf - Inf by an exponential:
    nanoGPT's attention backward at lr 1e7 is one).
Each line this module puts first ends with the evidence it follows from.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from debug_nan.engine.explain.causes.precision import low_dtype
from debug_nan.engine.sharded import local, user_path
from debug_nan.engine.stats import flat_tensors
from debug_nan.engine.vocabulary import Cause, Phase
from debug_nan.engine.watch.clipping import clipping_seen

# |x| past which a value's square overflows float32 (a variance, a norm, a product with a weight of size 1)
EXTREME = math.sqrt(torch.finfo(torch.float32).max)
MASK_CAUSES = (Cause.ALL_MASKED_SOFTMAX, Cause.MASKED_VALUE_USED)
GROWTH_CAUSES = (Cause.OVERFLOW, Cause.INF_ARITHMETIC, Cause.NONFINITE_PARAMETER, Cause.GRADIENT_EXPLOSION)
# finite |x| past which an op's input is taken to have grown (activations of an initialised network are O(1)-O(1e3))
GROWN = 1e6
# advice that blames the updates: wrong before any update, and clipping wrong where the run clips already
_LEARNING_RATE = ("learning rate", "warmup", "--max-grad-norm", "clip gradients")
_CLIPPING = ("--max-grad-norm", "clip gradients", "clip_grad_norm_")


@dataclass
class AdviceContext:
    """What the run shows besides the op: how many updates this run made before the micro-batch, where its state
    came from, whether it clips, and the batch (for its extreme values)."""

    updates: int  # optimizer updates this run made before the harmed micro-batch (0: none yet)
    checkpoint: str | None = None  # where the driver loaded the run's state from, where it did
    clipping: str | None = None  # how the run clips (clipping_of), None where it does not
    dataset_indices: list[int] | None = None  # the micro-batch's dataset indices (its sampler's), where known


def clipping_of(driver) -> str | None:
    """How the run clips its gradients: the clip_grad_norm_/clip_grad_value_ calls `debug-nan run` saw, else the
    driver's own setting (the CLI's --max-grad-norm, the HF Trainer's max_grad_norm, Lightning's
    gradient_clip_val, the Monitor's max_grad_norm), else None."""
    seen = clipping_seen()
    norm = getattr(getattr(driver, "s", None), "max_grad_norm", None) or getattr(driver, "max_grad_norm", None)
    return seen or (f"its clipping at max norm {norm:g}" if isinstance(norm, (int, float)) and norm else None)


def extreme_batch_value(batch, indices: list[int] | None = None) -> str | None:
    """"key `x` holds 3e+38 at row 2 (dataset index 881)" ("tensor holds ..." for a bare tensor) for the batch's
    largest finite |value| beyond EXTREME, else None."""
    best = None
    for key, t in flat_tensors(batch):
        if not t.is_floating_point() or not t.numel():
            continue
        finite = torch.where(torch.isfinite(t), t.detach().abs(), torch.zeros((), dtype=t.dtype, device=t.device))
        value = float(finite.max())
        if value > EXTREME and (best is None or value > best[1]):
            flat = int(finite.argmax())
            row = flat // max(1, t[0].numel()) if t.dim() else None
            best = (key, value, row)
    if best is None:
        return None
    key, value, row = best
    key = f"key `{key}`" if key else "tensor"
    where = "" if row is None else f" at row {row}"
    if row is not None and indices is not None and row < len(indices):
        where += f" (dataset index {indices[row]})"
    return f"{key} holds {value:.3g}{where}"


def largest_parameter(model: nn.Module, event=None) -> tuple[str, float] | None:
    """(name, largest |value|) of the op's own parameter inputs where it read any, else of the whole model. A
    sharded parameter is read in this rank's shard (no collective), and one whose storage FSDP has freed is left
    out."""
    named = [(user_path(n), local(p)) for n, p in model.named_parameters() if p.is_floating_point()]
    named = [(n, p) for n, p in named if p.numel() and _storage(p) is not None]
    if not named:
        return None
    sizes = [(n, _largest_finite(p)) for n, p in named]
    largest = max(sizes, key=lambda kv: kv[1])
    read = {_storage(t) for _, t in getattr(event, "inputs", []) if t.numel()}
    ptrs = {n: _storage(p) for n, p in named}
    own = [(n, v) for n, v in sizes if ptrs[n] in read]
    own_largest = max(own, key=lambda kv: kv[1]) if own else None
    # the op's own weight where it is of the model's largest order, else the largest (the embedding that fed it)
    return own_largest if own_largest is not None and own_largest[1] >= 0.1 * largest[1] else largest


def _largest_finite(t: torch.Tensor) -> float:
    """The largest finite |value| of `t` (NaN and Inf read as 0), one host read."""
    with torch.no_grad():
        return float(torch.nan_to_num(t.detach().abs(), nan=0.0, posinf=0.0).max())


def _storage(t: torch.Tensor) -> int | None:
    """Where `t`'s storage lives, or None where it has none to read (FSDP's freed unsharded parameter)."""
    try:
        return t.untyped_storage().data_ptr()
    except RuntimeError:
        return None


def rank_advice(cause: str, phase: str, suggestions: list[str], ctx: AdviceContext | None, batch=None,
                model: nn.Module | None = None, event=None, step: int | None = None) -> list[str]:
    """The suggestions in the order the evidence gives them, the first one saying what it follows from."""
    if ctx is None:
        return suggestions
    if cause in MASK_CAUSES:  # (the cause's own advice is the mask's, and the evidence above says which rows)
        return suggestions
    extreme = extreme_batch_value(batch, ctx.dataset_indices) if batch is not None else None
    if extreme is not None and phase not in (Phase.OPTIMIZER,):
        first = (f"Check the data first: the batch's {extreme}, beyond what float32 can square ({EXTREME:.3g}); "
                 f"the first product, norm or variance it enters overflows, whatever the model's weights. Filter or "
                 f"rescale such samples (normalise the inputs) before the model.")
        rest = [s for s in suggestions if not _mentions(s, _LEARNING_RATE)]
        return [f"{first} (Follows from the batch's statistics.)"] + rest
    if cause == Cause.OVERFLOW and event is not None and low_dtype(event) == torch.float16 and suggestions:
        return [f"{suggestions[0]} (Follows from the op's dtype: float16, whose range ends at 65504.)",
                *suggestions[1:]]
    grown = _grown_input(event) if cause == Cause.UNKNOWN else None
    if grown is None and cause not in GROWTH_CAUSES:
        return suggestions
    seen = "" if grown is None else (f"; the op's inputs reach |x| {grown[1]:.3g} (`{grown[0]}`), where float32 "
                                     f"rounds by about {grown[1] * 6e-8:.2g}")
    if ctx.updates == 0 and phase != Phase.OPTIMIZER:
        big = largest_parameter(model, event) if model is not None else None
        named = f": parameter `{big[0]}` holds |w| up to {big[1]:.3g}" if big is not None else ""
        source = (f"the checkpoint loaded ({ctx.checkpoint})" if ctx.checkpoint else
                  "the checkpoint or state_dict it was loaded from")
        first = (f"Check the weights as the run began{named}. No update had run yet, so no learning rate can be the "
                 f"cause: look at the initialisation (a custom init, a tensor scaled or left unfilled, to_empty "
                 f"without reset_parameters) or {source}.")
        rest = [s for s in suggestions if not _mentions(s, _LEARNING_RATE)]
        return [f"{first} (Follows from the step: step {step}, before any optimizer update of this run{seen}.)"] + rest
    if ctx.updates > 0:
        big = largest_parameter(model, event) if model is not None else None
        named = f" (`{big[0]}` holds |w| up to {big[1]:.3g})" if big is not None else ""
        if ctx.clipping:
            clip = (f" The run clips already ({ctx.clipping}): clipping bounds the gradient, not the step an "
                    f"adaptive optimizer takes (about lr per weight, whatever the gradient's size), so it cannot "
                    f"stop this growth.")
            rest = [s for s in suggestions if not _mentions(s, _CLIPPING + ("learning rate",))]
        else:
            clip = " Clip gradients (--max-grad-norm) if single steps are large."
            rest = [s for s in suggestions if not _mentions(s, ("learning rate",))]
        first = (f"Lower the learning rate, or add warmup; with Adam, a larger eps bounds the step where the "
                 f"gradient's second moment is tiny{named}.{clip}")
        return [f"{first} (Follows from the step: step {step}, after {ctx.updates} update(s) of this run, "
                f"so the weights the op read were grown by the updates{seen}.)"] + rest
    return suggestions


def _grown_input(event) -> tuple[str, float] | None:
    """(input name, largest finite |value|) of the op's floating inputs where it reaches GROWN, else None."""
    best = None
    for name, t in getattr(event, "inputs", None) or []:
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or not t.numel():
            continue
        value = _largest_finite(t)
        if value >= GROWN and (best is None or value > best[1]):
            best = (name, value)
    return best


def _mentions(text: str, words) -> bool:
    low = text.lower()
    return any(w.lower() in low for w in words)
