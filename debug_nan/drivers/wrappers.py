"""The wrappers frameworks put around the user's model and optimizer, seen through in one place for every entry
point.

  * a model: DDP / DataParallel and torch.compile's OptimizedModule (`bare`): the watch names modules as the user
    wrote them, and the replay runs the eager module under the tracer;
  * an optimizer or a scheduler (Accelerate's AcceleratedOptimizer and AcceleratedScheduler, Lightning's
    LightningOptimizer): an object whose `.optimizer` (`.scheduler`) is it, or wraps it in turn (`inner`,
    `wraps`). The watch hooks the torch optimizer inside; a script holds, schedules and steps the wrapper, so its
    scheduler and its `optimizer.step()` line are found through it (`step_location`).
"""

from __future__ import annotations

import sys

from torch import nn
from torch.nn.parallel import DistributedDataParallel

from debug_nan.frames import frame_kind, user_location

DEPTH = 4  # wrappers of wrappers, at most


def bare(module: nn.Module) -> nn.Module:
    """The user's module inside DDP / DataParallel and torch.compile wrappers."""
    return unwrapped(module)[0]


def unwrapped(module: nn.Module) -> tuple[nn.Module, bool]:
    """(the user's module inside DDP / DataParallel and torch.compile wrappers, whether torch.compile wrapped it)."""
    compiled = False
    while True:
        if isinstance(module, (DistributedDataParallel, nn.DataParallel)):
            module = module.module
        elif is_compiled(module):
            module, compiled = module._orig_mod, True
        else:
            return module, compiled


def is_compiled(module: nn.Module) -> bool:
    """Is `module` torch.compile's wrapper (torch._dynamo's OptimizedModule) of an eager module?"""
    return type(module).__name__ == "OptimizedModule" and isinstance(getattr(module, "_orig_mod", None), nn.Module)


def links(holder, link: str = "optimizer") -> list:
    """`holder`, then what its `.optimizer` (`link`) is, and so on: the wrapper chain, innermost last."""
    chain = [holder]
    for _ in range(DEPTH):
        holder = getattr(holder, link, None)
        if holder is None:
            break
        chain.append(holder)
    return chain


def inner(holder, link: str = "optimizer"):
    """The torch optimizer (link "scheduler": the torch scheduler) inside `holder`'s wrappers (`holder` itself when
    it wraps nothing)."""
    return links(holder, link)[-1]


def wraps(holder, optimizer) -> bool:
    """Is `holder` the optimizer, or a wrapper whose `.optimizer` (at some depth) is?"""
    return any(h is optimizer for h in links(holder))


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
