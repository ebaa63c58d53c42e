"""debug-nan's hooks on the user's modules, made to leave no mark on what the script does with its model.

A module keeps its hooks in its own dicts, so `copy.deepcopy(model)` (an EMA, `AveragedModel`) and
`torch.save(model)` copy them too: a bound method of the watch would drag the watch (its streams, the optimizer)
into the copy, and fail to pickle. torch has no way to leave a module hook out of a copy (it serialises no hooks of
tensors, but a module's are plain state), and its global module hooks cost every call of every module, so each
hook copies and pickles as a no-op built of the standard library alone: a loaded copy needs no debug-nan and calls
nothing of it, and a copy is not watched.

Under torch.compile, dynamo would trace the hooks into the user's graph (and break it at `time.perf_counter`):
`skip_compiled` hooks return at once inside a graph being traced (nothing of them is captured; the module outputs
of a compiled region are then not measured), `eager` ones run eagerly (torch.compiler.disable: a graph break, for
the root's pre-hook only, before its whole forward).
"""

from __future__ import annotations

import functools
import sys

import torch

# sys.audit(event, *args) returns None, takes any arguments and does nothing unless an audit hook listens
LEFT_BEHIND = "debug_nan.hook_of_a_copy"


def left_behind() -> functools.partial:
    """What a copy of a debug-nan hook is: a no-op any Python can load."""
    return functools.partial(sys.audit, LEFT_BEHIND)


class ModuleHook:
    """A forward (pre-)hook callable for a user's module: calls `call`; deep-copies and pickles as left_behind()."""

    __slots__ = ("call",)

    def __init__(self, call, compiled: str = "skip"):
        if compiled not in ("skip", "eager"):
            raise ValueError(compiled)
        self.call = torch.compiler.disable(call) if compiled == "eager" else _skip_compiled(call)

    def __call__(self, *args):
        return self.call(*args)

    def __reduce__(self):
        return functools.partial, (sys.audit, LEFT_BEHIND)


def _skip_compiled(call):
    def hook(*args):
        if torch.compiler.is_compiling():  # traced by dynamo: a constant, so the graph holds nothing of the hook
            return None
        return call(*args)

    return hook
