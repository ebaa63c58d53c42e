"""Which module of the user's script is the model, what one of its calls gives, and what its modules keep
(`debug-nan run`)."""

from __future__ import annotations

import gc
from contextlib import contextmanager

import torch
from torch import nn

from debug_nan.engine.replay.driver import NotReplayable
from debug_nan.engine.sharded import WRAPPER_SEGMENTS


# a wrapper's attribute for the module it wraps: DDP's, Lightning's wrapper base's, and the segments names leave out
WRAPPED = ("module", "_forward_module", *sorted(WRAPPER_SEGMENTS))


def redirected_forward(module: nn.Module) -> tuple[str, str] | None:
    """The method a strategy made the forward of `module` (or of the module it wraps, FSDP1's) for this call:
    (that module's path under `module`, the method's name), else None. Lightning's DDP and FSDP strategies set the
    LightningModule's `forward` to a function that runs `training_step`, then call their wrapper; the replay
    calls the model itself, so it makes the same redirection (`forward_as`)."""
    path = ""
    for _ in range(4):
        patched = vars(module).get("forward")
        for cell in getattr(patched, "__closure__", None) or ():
            try:
                value = cell.cell_contents
            except ValueError:  # (an empty cell)
                continue
            if isinstance(value, str) and value != "forward" and callable(getattr(type(module), value, None)):
                return path, value
        inner = next((a for a in WRAPPED if isinstance(module._modules.get(a), nn.Module)), None)
        if inner is None:
            return None
        module, path = getattr(module, inner), f"{path}.{inner}" if path else inner
    return None


@contextmanager
def forward_as(model: nn.Module, redirect: tuple[str, str] | None):
    """Inside: the forward of `model`'s module at the path is its method named as redirected_forward found it in
    the run; after: as it was."""
    if redirect is None:
        yield
        return
    module, missing = model.get_submodule(redirect[0]), object()
    was = vars(module).get("forward", missing)
    method = getattr(module, redirect[1])

    def put_back() -> None:
        if was is missing:
            vars(module).pop("forward", None)
        else:
            module.forward = was

    def redirected(*args, **kwargs):  # once, as the strategy's own redirection: the method's own model calls
        put_back()  # (`self(x)` inside training_step) are the module's forward again
        return method(*args, **kwargs)

    module.forward = redirected
    try:
        yield
    finally:
        put_back()


def batch_of(args: tuple, kwargs: dict):
    """A forward call's arguments as one batch: the single argument, the keyword arguments (HF models), a list
    of the positional ones, or {"args": [...], **kwargs} when both are given."""
    if kwargs and not args:
        return dict(kwargs)
    if not kwargs:
        return args[0] if len(args) == 1 else list(args)
    return {"args": list(args), **kwargs}


def loss_of(tensors) -> torch.Tensor:
    """The loss of a backward call: its tensor, or for several scalar ones (backward([a, b]) back-propagates
    a + b) their sum in float64, non-finite exactly when one of them is (no overflow of finite losses)."""
    if isinstance(tensors, torch.Tensor):
        return tensors
    if len(tensors) > 1 and all(t.numel() == 1 for t in tensors):
        return torch.stack([t.detach().reshape(()).to(torch.float64) for t in tensors]).sum()
    return tensors[0]


def optimizer_params(optimizer: torch.optim.Optimizer) -> set[int]:
    """The ids of the parameters `optimizer` updates."""
    return {id(p) for g in optimizer.param_groups for p in g["params"]}


def leaves_reached(tensors) -> set[int]:
    """The ids of the leaf tensors (parameters, where a model owns them) a backward from `tensors` reaches."""
    roots = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    reached, todo, seen = set(), [t.grad_fn for t in roots if t.grad_fn is not None], set()
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if hasattr(node, "variable"):  # AccumulateGrad: a leaf
            reached.add(id(node.variable))
        todo.extend(n for n, _ in node.next_functions)
    return reached


def owners(wanted: set[int]) -> list[nn.Module]:
    """Every module that owns all the parameters whose ids are `wanted` (an optimizer's: a model, its DDP wrapper,
    a LightningModule)."""
    if not wanted:
        return []
    found = []
    for obj in gc.get_objects():  # type(), not isinstance(): some lazy objects warn when __class__ is read
        if issubclass(type(obj), nn.Module) and not issubclass(type(obj), torch.jit.ScriptModule):
            ids = {id(p) for p in obj.parameters()}
            if wanted <= ids:
                found.append(obj)
    return found


def held_by(model: nn.Module | None, x: torch.Tensor) -> tuple | None:
    """Where the model keeps `x` as it left its forward: (module name, attribute, index or key, or None), for a
    tensor a module stored on itself (an auxiliary loss, `self.aux_loss = ...` in a mixture of experts; a forward
    hook's `module.saved = output`), or None. Walked only for a tensor with a graph that the tape did not record."""
    if model is None:
        return None
    for name, module in model.named_modules():
        for attr, value in vars(module).items():
            if value is x:
                return name, attr, None
            if attr.startswith("_"):  # (torch's own dicts: parameters, buffers, submodules, hooks)
                continue
            items = value.items() if isinstance(value, dict) else enumerate(value) \
                if isinstance(value, (list, tuple)) else ()
            for key, item in items:
                if item is x:
                    return name, attr, key
    return None


def attribute(model: nn.Module, name: str, attr: str, key) -> torch.Tensor:
    """The replay's value of what held_by found: the attribute as the replayed forward left it."""
    try:
        value = getattr(model.get_submodule(name), attr)
        value = value if key is None else value[key]
    except (AttributeError, KeyError, IndexError, TypeError):
        value = None
    if not isinstance(value, torch.Tensor):
        raise NotReplayable(f"the model's `{name or '<root>'}.{attr}` held a tensor in the run, not in the replay")
    return value


def stashed_by_hook(model: nn.Module | None, x: torch.Tensor) -> tuple | None:
    """(container, key) of a dict or list a forward hook of the script's stores `x` in (`activations[name] = output`
    in a hook made by a closure, or a global the hook names), or None: the replayed forward runs the hook again, so
    the container then holds the replay's value. Only the modules that have forward hooks are looked at."""
    if model is None:
        return None
    for module in model.modules():
        for hook in list(module._forward_hooks.values()):
            for container in _hook_containers(hook):
                items = container.items() if isinstance(container, dict) else enumerate(container)
                for key, item in items:
                    if item is x:
                        return container, key
    return None


def _hook_containers(hook) -> list:
    """The dicts and lists a hook function can reach: its closure's cells, the globals its code names, its bound
    object's attributes."""
    function = getattr(hook, "__func__", hook)
    code = getattr(function, "__code__", None)
    if code is None:  # (debug-nan's own hooks, a C function)
        return []
    values = [cell.cell_contents for cell in (function.__closure__ or ()) if _filled(cell)]
    values += [function.__globals__[n] for n in code.co_names if n in function.__globals__]
    if hasattr(hook, "__self__"):
        values += list(vars(hook.__self__).values()) if hasattr(hook.__self__, "__dict__") else []
    return [v for v in values if isinstance(v, (dict, list)) and len(v) <= 4096]  # (not a dataset the hook names)


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:  # an empty cell
        return False
    return True


def stashed(container, key) -> torch.Tensor:
    """The replay's value of what stashed_by_hook found."""
    try:
        value = container[key]
    except (KeyError, IndexError):
        value = None
    if not isinstance(value, torch.Tensor):
        raise NotReplayable(f"a forward hook's `[{key!r}]` held a tensor in the run, not in the replay")
    return value
