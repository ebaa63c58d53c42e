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
the root's pre-hook only, before its whole forward). torch.compiler.disable imports torch._dynamo (about 2 s of CPU
at start-up), and nothing can be traced before torch._dynamo is imported, so an `eager` hook is disabled for dynamo
when dynamo's module has loaded: at once if it is in sys.modules, else by `_AfterDynamo` as its import ends.
"""

from __future__ import annotations

import functools
import sys
import weakref

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

    __slots__ = ("call", "__weakref__")

    def __init__(self, call, compiled: str = "skip"):
        if compiled not in ("skip", "eager"):
            raise ValueError(compiled)
        self.call = call if compiled == "eager" else _skip_compiled(call)
        if compiled == "eager":
            _AfterDynamo.disable(self)

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


class _AfterDynamo:
    """Disables `eager` hooks for dynamo (torch.compiler.disable) once torch._dynamo is loaded: a meta path finder
    that sees its import go by and, when its module has run, disables the hooks made before."""

    waiting: weakref.WeakSet = weakref.WeakSet()

    @classmethod
    def disable(cls, hook: ModuleHook) -> None:
        if "torch._dynamo" in sys.modules:
            hook.call = torch.compiler.disable(hook.call)
            return
        cls.waiting.add(hook)
        if not any(isinstance(f, cls) for f in sys.meta_path):
            sys.meta_path.insert(0, cls())

    def find_spec(self, name, path=None, target=None):
        if name != "torch._dynamo":
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _DisableAfter(spec.loader)
                return spec
        return None


class _DisableAfter:
    """torch._dynamo's own loader, which disables the waiting hooks once its module has run."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self.loader  # (its own, for whoever reads it later)
        for hook in list(_AfterDynamo.waiting):
            hook.call = torch.compiler.disable(hook.call)
        _AfterDynamo.waiting.clear()

    def __getattr__(self, name):
        return getattr(self.loader, name)
