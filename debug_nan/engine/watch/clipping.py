"""Does the run clip its gradients? The advice suggests clipping only where the run does not clip already.

`clip_watching(fn)` wraps torch.nn.utils.clip_grad_norm_ / clip_grad_value_ (debug-nan run installs it before the
script runs): each call notes the function and its bound, then calls the original unchanged, so the run's clipping
stays the script's own. A driver whose framework clips by a setting (the Trainer's --max-grad-norm) notes it with
`clipping_by`. One run per process, so the record is the process's.
"""

from __future__ import annotations

import functools

_seen: dict[str, str] = {}  # "torch.nn.utils.clip_grad_norm_" -> "max_norm 1.0" (its last bound)


def clipping_by(what: str, bound: str = "") -> None:
    """The run clips gradients with `what` (a function or a setting), at `bound`."""
    _seen[what] = bound


def clipping_seen() -> str | None:
    """"torch.nn.utils.clip_grad_norm_ (max_norm 1.0)" for the clipping the run did, else None."""
    if not _seen:
        return None
    return "; ".join(f"{what} ({bound})" if bound else what for what, bound in _seen.items())


def forget_clipping() -> None:
    """(a new run in this process: the tests' in-process runs)"""
    _seen.clear()


def clip_watching(fn, bound_name: str):
    """`fn` (clip_grad_norm_ or clip_grad_value_), noting each call's bound (its argument `bound_name`)."""
    name = f"torch.nn.utils.{fn.__name__}"

    @functools.wraps(fn)
    def clipping(parameters, *args, **kwargs):
        bound = kwargs.get(bound_name, args[0] if args else None)
        clipping_by(name, f"{bound_name} {bound:g}" if isinstance(bound, (int, float)) else "")
        return fn(parameters, *args, **kwargs)

    return clipping
