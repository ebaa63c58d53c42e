"""Optimizer wrappers (Accelerate's AcceleratedOptimizer, Lightning's LightningOptimizer): an object whose
`.optimizer` is the optimizer, or wraps it in turn. The watch hooks the torch optimizer inside; the script holds,
schedules and steps the wrapper, so its scheduler and its `optimizer.step()` line are found through it."""

from __future__ import annotations

import sys

from debug_nan.frames import frame_kind, user_location

DEPTH = 4  # wrappers of wrappers, at most


def wraps(holder, optimizer) -> bool:
    """Is `holder` the optimizer, or a wrapper whose `.optimizer` (at some depth) is?"""
    for _ in range(DEPTH + 1):
        if holder is optimizer:
            return True
        holder = getattr(holder, "optimizer", None)
        if holder is None:
            return False
    return False


def step_location(optimizer, depth: int = 1) -> tuple[str, int] | None:
    """(filename, lineno) of the script's call of `optimizer.step()`, from inside the step: the innermost user
    frame outside the `step` of an optimizer wrapper of `optimizer` (an object with param_groups whose `.optimizer`
    is it) and outside the rest of its file (a patched step): the wrapper's own `self.optimizer.step()` line says
    nothing of the script's. A script's own class that merely holds `self.optimizer` is no wrapper."""
    frame, skipped = sys._getframe(depth), set()
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename not in skipped and frame_kind(filename) == "user":
            if not (frame.f_code.co_name == "step" and _is_wrapper(frame.f_locals.get("self"), optimizer)):
                return filename, frame.f_lineno
            skipped.add(filename)
        frame = frame.f_back
    return user_location(depth + 1)


def _is_wrapper(holder, optimizer) -> bool:
    return (holder is not None and holder is not optimizer and hasattr(holder, "param_groups")
            and wraps(holder, optimizer))
