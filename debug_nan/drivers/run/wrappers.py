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
    frame outside the `step` of every optimizer wrapper of `optimizer` (an object with param_groups whose
    `.optimizer` is it), whose own `self.optimizer.step()` line says nothing of the script's. A script's own class
    that merely holds `self.optimizer` is no wrapper."""
    frames, frame = [], sys._getframe(depth)
    while frame is not None:  # innermost first (once per optimizer step: a few dozen frames at most)
        frames.append(frame)
        frame = frame.f_back
    outer = max((i for i, f in enumerate(frames) if f.f_code.co_name == "step"
                 and frame_kind(f.f_code.co_filename) == "user" and _is_wrapper(f.f_locals.get("self"), optimizer)),
                default=-1)
    for frame in frames[outer + 1:]:
        if frame_kind(frame.f_code.co_filename) == "user":
            return frame.f_code.co_filename, frame.f_lineno
    return user_location(depth + 1)


def _is_wrapper(holder, optimizer) -> bool:
    return (holder is not None and holder is not optimizer and hasattr(holder, "param_groups")
            and wraps(holder, optimizer))
