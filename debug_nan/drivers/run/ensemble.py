"""What `debug-nan run` watches when no single module and optimizer are the whole training: a GAN's generator and
discriminator with an optimizer each, an actor and a critic, two encoders and a bare `nn.Parameter` (CLIP's
`logit_scale`) under one AdamW.

The session (engine/session/) watches one model and one optimizer. Here they are a `Models` container that holds
the script's modules as children (the modules themselves are not changed: a module may have several parents) and
its bare parameters, named as the script names them (`netD.main.2.weight`, `logit_scale`), and an `Optimizers`
set that reads and restores every optimizer's state at once and steps the one the run stepped when a step is
replayed. A step is any optimizer's step; a micro-batch opens at the first forward of any of the models.
"""

from __future__ import annotations

import gc
import sys
from collections.abc import MutableMapping

import torch
from torch import nn

from debug_nan.drivers.wrappers import bare


def cover(params: list[nn.Parameter]) -> tuple[list[nn.Module], list[nn.Parameter]]:
    """The outermost modules whose parameters all are in `params`, and those of `params` that none of them owns
    (bare ones): how an optimizer's parameters are held when no one module owns them all."""
    wanted = {id(p) for p in params}
    candidates = []
    for obj in gc.get_objects():  # type(), not isinstance(): some lazy objects warn when __class__ is read
        if issubclass(type(obj), nn.Module) and not issubclass(type(obj), torch.jit.ScriptModule):
            ids = {id(p) for p in obj.parameters()}
            if ids and ids <= wanted:
                candidates.append(obj)
    inner = {id(sub) for m in candidates for sub in m.modules() if sub is not m}
    outer = [m for m in candidates if id(m) not in inner]
    owned = {id(p) for m in outer for p in m.parameters()}
    return outer, [p for p in params if id(p) not in owned]


def script_name(obj, fallback: str) -> str:
    """The name the script's `__main__` gives `obj` (`netD`, `logit_scale`), else `fallback`."""
    main = sys.modules.get("__main__")
    for name, value in (vars(main).items() if main is not None else ()):
        if value is obj and not name.startswith("_"):
            return name
    return fallback


class Models(nn.Module):
    """The models a run trains, as one module: its children in the order met, bare parameters at the top."""

    def __init__(self, modules: list[nn.Module], loose: list[nn.Parameter]):
        super().__init__()
        taken: set[str] = set()
        for i, module in enumerate(modules):
            module = bare(module)
            name = _unique(script_name(module, f"{type(module).__name__.lower()}{i}"), taken)
            self.add_module(name, module)
        for i, p in enumerate(loose):
            self.register_parameter(_unique(script_name(p, f"parameter{i}"), taken), p)

    def describe(self) -> str:
        names = [n for n, _ in self.named_children()] + [n for n, _ in self.named_parameters(recurse=False)]
        return " + ".join(names)

    def forward(self, *args, **kwargs):
        raise TypeError("Models is debug-nan's view of several models: call one of its members")


def _unique(name: str, taken: set[str]) -> str:
    base, n = name, 2
    while name in taken:
        name, n = f"{base}_{n}", n + 1
    taken.add(name)
    return name


class _States(MutableMapping):
    """Every optimizer's `state`, read as one mapping (parameter -> its state); written to its own optimizer."""

    def __init__(self, owner: Optimizers):
        self._owner = owner

    def _of(self, p):
        return self._owner.member_of(p).state

    def __getitem__(self, p):
        return self._of(p)[p]  # (a defaultdict: a parameter without state yet gets one, as in its optimizer)

    def __setitem__(self, p, value) -> None:
        self._of(p)[p] = value

    def __delitem__(self, p) -> None:
        del self._of(p)[p]

    def __contains__(self, p) -> bool:
        return any(p in o.state for o in self._owner.members)

    def get(self, p, default=None):  # (never through __getitem__: a defaultdict would make an empty state)
        return self._of(p).get(p, default) if self._owner.holds(p) else default

    def pop(self, p, *default):
        return self._of(p).pop(p, *default)

    def items(self):
        return [item for o in self._owner.members for item in o.state.items()]

    def __iter__(self):
        return iter([p for o in self._owner.members for p in o.state])

    def __len__(self) -> int:
        return sum(len(o.state) for o in self._owner.members)


class _Handles:
    def __init__(self, handles):
        self.handles = handles

    def remove(self) -> None:
        for h in self.handles:
            h.remove()


class Optimizers:
    """The script's optimizers as the one optimizer the session reads: their states, their param groups (in
    order), state_dict / load_state_dict of all; `step()` steps the member a replay names (`stepping`)."""

    def __init__(self, members: list):
        self.members = list(members)
        self.names = [script_name(o, f"optimizer{i}") for i, o in enumerate(self.members)]
        self.stepping: list[int] | None = None
        self._index()

    def _index(self) -> None:
        self._owner_of = {id(p): o for o in self.members for g in o.param_groups for p in g["params"]}
        self.state = _States(self)

    def __getstate__(self) -> dict:  # (a repro bundle: parameters get new ids when loaded)
        return {"members": self.members, "names": self.names, "stepping": self.stepping}

    def __setstate__(self, state: dict) -> None:
        self.members, self.names, self.stepping = state["members"], state["names"], state["stepping"]
        self._index()

    def holds(self, p) -> bool:
        return id(p) in self._owner_of

    def member_of(self, p):
        return self._owner_of[id(p)]

    def index(self, optimizer) -> int | None:
        return next((i for i, o in enumerate(self.members) if o is optimizer), None)

    @property
    def param_groups(self) -> list[dict]:
        return [g for o in self.members for g in o.param_groups]

    @property
    def defaults(self) -> dict:
        return self.members[0].defaults

    def locate(self, index: int) -> tuple[object, str, int]:
        """(the optimizer, its name in the script, its own index) of param group `index` of param_groups."""
        for optimizer, name in zip(self.members, self.names):
            if index < len(optimizer.param_groups):
                return optimizer, name, index
            index -= len(optimizer.param_groups)
        raise IndexError(index)

    def describe(self, i: int) -> str:
        return f"{type(self.members[i]).__name__} `{self.names[i]}`"

    def step(self, closure=None) -> None:
        """The optimizers a replay names (`stepping`, their indices in the order the run stepped them)."""
        if self.stepping is None:
            raise RuntimeError("Optimizers.step(): which optimizer stepped is not known")
        for i in self.stepping:
            self.members[i].step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for o in self.members:
            o.zero_grad(set_to_none=set_to_none)

    def register_step_pre_hook(self, hook):
        return _Handles([o.register_step_pre_hook(hook) for o in self.members])

    def state_dict(self) -> dict:
        return {"optimizers": [o.state_dict() for o in self.members]}

    def load_state_dict(self, state: dict) -> None:
        for o, s in zip(self.members, state["optimizers"]):
            o.load_state_dict(s)


def watched_set(optimizers: list) -> tuple[nn.Module, Optimizers]:
    """The models and optimizers of a script that trains several (or one whose parameters no module owns): the
    one module that holds them all where there is one (two optimizers over one model's halves: its names stay the
    script's), else a Models of them."""
    params = list({id(p): p for o in optimizers for g in o.param_groups for p in g["params"]}.values())
    modules, loose = cover(params)
    if len(modules) == 1 and not loose:
        return bare(modules[0]), Optimizers(optimizers)
    return Models(modules, loose), Optimizers(optimizers)


def parameter_count(model: nn.Module, optimizer) -> str:
    """"306,370 parameters" as the user knows them: those the run's optimizers hold (every parameter of `model`
    when it has none), and apart, the model's parameters no optimizer holds (a model EMA's copy, frozen layers)
    with the submodules that hold them: ", and 306,370 more in `model_ema` that no optimizer trains"."""
    params = list(model.parameters())
    if optimizer is None:
        return f"{sum(p.numel() for p in params):,} parameters"
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    trained = sum(p.numel() for p in params if id(p) in held)
    apart = {}
    for name, p in model.named_parameters():
        if id(p) not in held:
            top = name.split(".", 1)[0] if "." in name else name
            apart[top] = apart.get(top, 0) + p.numel()
    if not apart:
        return f"{trained:,} parameters"
    where = ", ".join(f"`{n}`" for n in list(apart)[:3]) + (" ..." if len(apart) > 3 else "")
    return (f"{trained:,} parameters the optimizer holds, and {sum(apart.values()):,} more in {where} that no "
            f"optimizer trains")
