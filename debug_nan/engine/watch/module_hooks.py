"""debug-nan's hooks on the user's modules, made to leave no mark on what the script does with its model.

A module keeps its hooks in its own dicts, so `copy.deepcopy(model)` (an EMA, `AveragedModel`) and
`torch.save(model)` copy them too: a bound method of the watch would drag the watch (its streams, the optimizer)
into the copy, and fail to pickle. torch has no way to leave a module hook out of a copy (a module's hooks are plain
state, and its global module hooks cost every call of every module), so `keep_out_of_copies` wraps the
`__getstate__` of each hooked module's class (torch's own, or the class's: an LSTM's, DDP's) to hand copies and
pickles the hook dicts without debug-nan's hooks: the copy holds exactly the user's hooks, a plain OrderedDict, and
`torch.load(weights_only=True)` reads it as it reads an unwatched model. Should a hook be copied anyway (a class
whose state is not its __getstate__'s), it copies and pickles as a no-op of the standard library alone.

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
_HOOK_DICTS = ("_forward_hooks", "_forward_pre_hooks")
_HOOK_FLAGS = ("_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks_with_kwargs")


def keep_out_of_copies(module: torch.nn.Module) -> None:
    """Make copies and pickles of `module` (and of its class's other instances) leave debug-nan's hooks out."""
    cls = type(module)
    state_of = cls.__getstate__  # (resolved through the class's bases)
    if getattr(state_of, "leaves_debug_nan_hooks_out", False):
        return

    def __getstate__(self):
        return _without_our_hooks(state_of(self))

    __getstate__.leaves_debug_nan_hooks_out = True
    __getstate__.__wrapped__ = state_of
    cls.__getstate__ = __getstate__


def _without_our_hooks(state):
    if not isinstance(state, dict) or not any(isinstance(h, ModuleHook) for key in _HOOK_DICTS
                                              for h in (state.get(key) or {}).values()):
        return state
    state, ours = dict(state), set()  # (never the module's own dicts: they stay as they are)
    for key in _HOOK_DICTS:
        hooks = state.get(key)
        if hooks:
            ours |= {k for k, h in hooks.items() if isinstance(h, ModuleHook)}
            state[key] = type(hooks)((k, h) for k, h in hooks.items() if not isinstance(h, ModuleHook))
    for key in _HOOK_FLAGS:
        flags = state.get(key)
        if flags:
            state[key] = type(flags)((k, v) for k, v in flags.items() if k not in ours)
    return state


class ModuleHook:
    """A forward (pre-)hook callable for a user's module: calls `call`; a deep copy or a pickle of it is a no-op
    any Python can load (`sys.audit(LEFT_BEHIND)`)."""

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
