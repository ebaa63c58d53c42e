"""The script's own code around the model, recorded so that `debug-nan run` replays a micro-batch IN PLACE.

`debug-nan run` cannot call the script's loss code again: it is whatever the script wrote between the model's
forward and `backward()` (a cross-entropy, a contrastive pair of forwards, a gradient penalty through
`torch.autograd.grad`, a GradScaler's scale). So, while a micro-batch runs, a TorchFunctionMode (`Recorder`)
writes each torch call made OUTSIDE the model's forward into a `Tape`: the function, its arguments (tensors by
where they came from) and which slots its tensor outputs fill. The model's forward itself is one entry (the mode is
off inside it: its ops cost nothing extra), replayed by calling the model again. A second tape runs from the last
backward to the optimizer step (clipping, a GradScaler's unscale), for the replay of an update.

Replaying a tape calls the same functions again, with autograd on, the replayed model's outputs in place of the
run's, from the run's own state at that step (the session's copy): exact without a deterministic run, and the
script's files, prints and logs are not touched again. A tensor argument is one of
  * a slot: an output of an earlier entry (the model's outputs included),
  * a parameter of the model (restored in place by the copy),
  * an outside tensor (targets, a mask made before the forward): cloned when small, else kept with its version
    counter, which must not have moved at the replay (the script changed it in place since: not replayable),
  * a module attribute: a tensor the model's forward left on one of its modules (a mixture of experts'
    `self.aux_loss`), read there again after the replayed forward (held_by),
  * a hook's stash: a tensor a forward hook of the script's stored in a dict or list (`activations[name] =
    output`), read there again after the replayed forward has run the hook again (stashed_by_hook),
  * never another tensor that carries a graph made outside the tape: the tape says why it cannot be replayed, and
    the watch's finding stands.
Tensors are tracked by identity with weak references: the tape keeps none of the run's activations alive.

Each entry keeps the autocast state it ran under (engine/session/precision.py's autocast_state: enabled device
types, dtype, cache; nested regions and torch.autocast as a decorator are simply the state in force at the call),
and the replay re-enters exactly that state around it: the model's forward, the loss code and a custom autograd
Function (whose torch.amp.custom_fwd / custom_bwd read it) run in the run's precision. Each entry also keeps its
tensor outputs' dtypes; the first replayed output whose dtype is not the run's is the replay's divergence
(`Tape.diverged`, in words), which the finding states.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_unflatten

from debug_nan.drivers.run.model_calls import attribute, forward_as, held_by, stashed, stashed_by_hook
from debug_nan.engine.replay.driver import NotReplayable
from debug_nan.engine.session.precision import autocast_as, autocast_state, dtype_name
from debug_nan.frames import replayed_at, user_location

SMALL = 1 << 16  # outside tensors up to this many elements are cloned when first used (targets, masks, scales)


@dataclass
class Entry:
    func: object  # a torch function, or MODEL: a call of the model
    leaves: list  # the flattened (args, kwargs), each encoded (see Tape._encode)
    spec: object  # their tree structure
    outputs: list  # the slot of each tensor output, in the output's flattened order (None: not a tensor)
    location: tuple | None = None  # (filename, lineno) of the user's line that made the call
    member: str | None = None  # a model call where the run has several optimizers: the module's path in the model
    forward: tuple | None = None  # a call whose forward a strategy redirected: (path, "training_step"), Lightning's
    autocast: tuple | None = None  # the autocast state it ran under (precision.autocast_state; None: not recorded)
    dtypes: list | None = None  # the dtype of each output of `outputs` (None where not a tensor)


class _ModelCall:
    """The entry of a call of the model itself. One object, compared by identity: a bundle's copy (pickled by
    name) is this one again."""

    __name__ = "model"  # (what a message calls the entry's function)

    def __reduce__(self):
        return "MODEL"

    def __repr__(self):
        return "MODEL"


MODEL = _ModelCall()


@dataclass
class Tape:
    """One recorded region: a micro-batch (first model call -> backward) or an update (backward -> step)."""

    entries: list = field(default_factory=list)
    externals: list = field(default_factory=list)  # (tensor, version or None when cloned)
    slots: int = 0
    backward: tuple | None = None  # (leaves, spec) of the backward() call that closed the micro-batch
    first_form: str | None = None  # how the first model call's arguments were given (see batch_form)
    step_location: tuple | None = None  # an update's: (filename, lineno) of the script's optimizer.step() call
    stepped: list | None = None  # an update's, where the run has several optimizers: which stepped, in order
    previous: Tape | None = None  # an update's: the micro-batch tape it follows (its values may be used here)
    inputs: list = field(default_factory=list)  # the first model call's tensors: (slot, requires_grad) each
    unreplayable: str | None = None
    owner: nn.Module | None = None  # the bare model: a module attribute holding a tensor is found in it
    backward_autocast: tuple | None = None  # the autocast state the backward() call ran under
    scale_slots: tuple | None = None  # (slot of GradScaler.scale()'s output, slot of the loss it scaled)
    _slot_of: dict = field(default_factory=dict)  # id(tensor) -> (slot, weak reference)
    _external_of: dict = field(default_factory=dict)  # id(tensor) -> (index in externals, the tensor)

    # -- recording ----------------------------------------------------------------------------------------------
    def first_inputs(self, args: tuple, kwargs: dict) -> None:
        """The first model call's tensors get slots: the script's code may use them again (a gradient penalty
        differentiates with respect to an input that requires grad); the replay binds the captured batch's."""
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor):
                self.inputs.append((self._slot(t), t.requires_grad and t.grad_fn is None))

    def model_call(self, args: tuple, kwargs: dict) -> Entry:
        """A call of the model (its outputs are bound by `returned`); the first one's arguments are the captured
        batch, given at the replay."""
        if self.entries or args or kwargs:
            return self.arguments(MODEL, args, kwargs)
        return Entry(MODEL, [], None, [], user_location(2), autocast=autocast_state())

    def arguments(self, func, args: tuple, kwargs: dict) -> Entry:
        """A call's entry, its arguments encoded BEFORE it runs (an in-place op moves its inputs' versions), with
        the autocast state in force."""
        leaves, spec = tree_flatten((args, kwargs))
        return Entry(func, [self._encode(x) for x in leaves], spec, [], user_location(3), autocast=autocast_state())

    def returned(self, entry: Entry, out) -> None:
        entry.outputs, entry.dtypes = self._bind(out)
        self.entries.append(entry)

    def close(self, args: tuple, kwargs: dict) -> None:
        """The backward() call that ends the micro-batch: its arguments, encoded like any entry's."""
        leaves, spec = tree_flatten((args, kwargs))
        self.backward = ([self._encode(x) for x in leaves], spec)
        self.backward_autocast = autocast_state()

    def loss_scaled(self, scaled: torch.Tensor, loss: torch.Tensor) -> None:
        """`scaled` is a GradScaler's scale() of `loss`: a replay can back-propagate the loss unscaled instead
        (the overflow probe: gradients at scale 1)."""
        a, b = self._slot_of.get(id(scaled)), self._slot_of.get(id(loss))
        if a is not None and b is not None and a[1]() is scaled and b[1]() is loss:
            self.scale_slots = (a[0], b[0])

    def _bind(self, out) -> tuple[list, list]:
        """(the slot of each tensor output, its dtype), None for the outputs that are not tensors."""
        leaves = [out] if isinstance(out, torch.Tensor) else tree_flatten(out)[0]
        tensor = [isinstance(t, torch.Tensor) for t in leaves]
        return ([self._slot(t) if is_t else None for t, is_t in zip(leaves, tensor)],
                [t.dtype if is_t else None for t, is_t in zip(leaves, tensor)])

    def _slot(self, t: torch.Tensor) -> int:
        known = self._slot_of.get(id(t))
        if known is not None and known[1]() is t:  # an in-place op returns its input: the same slot
            return known[0]
        self._slot_of[id(t)] = (self.slots, weakref.ref(t))
        self.slots += 1
        return self.slots - 1

    def _encode(self, x):
        if not isinstance(x, torch.Tensor):
            return ("c", x)
        known = self._slot_of.get(id(x))
        if known is not None and known[1]() is x:
            return ("s", known[0])
        if isinstance(x, nn.Parameter):
            return ("p", x)
        before = self.previous._slot_of.get(id(x)) if self.previous is not None else None
        if before is not None and before[1]() is x:  # the last micro-batch's loss, detached for logging
            return ("m", before[0])
        known = self._external_of.get(id(x))
        index = known[0] if known is not None and known[1] is x else None
        if index is None and x.grad_fn is not None and (held := held_by(self.owner, x)) is not None:
            return ("a", held)  # made by the model's forward, kept on one of its modules: read there again
        if index is None and x.grad_fn is not None and (held := stashed_by_hook(self.owner, x)) is not None:
            return ("k", held)  # ... or stored by a forward hook of the script's: the hook stores it again
        if index is None:
            if x.grad_fn is not None and self.unreplayable is None:
                self.unreplayable = (f"the script's code used a {tuple(x.shape)} tensor computed by "
                                     f"{type(x.grad_fn).__name__} outside the recorded calls (e.g. an activation "
                                     f"a hook stashed outside the model): its graph cannot be rebuilt")
            index = len(self.externals)
            small = x.numel() <= SMALL and x.grad_fn is None and not x.requires_grad
            self.externals.append((x.detach().clone(), None) if small else (x, x._version))
            self._external_of[id(x)] = (index, x)  # (held: its id cannot be another tensor's while the tape lives)
        return ("x", index)

    def unused_model_calls(self) -> list[int]:
        """The model calls (their order among the tape's model calls) whose outputs the backward's tensors do not
        descend from: forwards the script gave up on (a NaN loss it skipped with `continue`) or never meant to train
        (an accuracy computed with gradients on)."""
        if self.backward is None:
            return []
        needed = {x for kind, x in self.backward[0] if kind == "s"}
        reached = set()
        calls = [i for i, e in enumerate(self.entries) if e.func is MODEL]
        for i in range(len(self.entries) - 1, -1, -1):
            entry = self.entries[i]
            if needed.intersection(s for s in entry.outputs if s is not None):
                needed.update(x for kind, x in entry.leaves if kind == "s")
                reached.add(i)
        return [n for n, i in enumerate(calls) if i not in reached]

    def up_to_model_call(self, n: int) -> Tape:
        """This tape as far as its model call `n` (0-based, among the model calls), with no backward: what a replay
        of a forward the script gave up on runs."""
        calls = [i for i, e in enumerate(self.entries) if e.func is MODEL]
        return Tape(entries=self.entries[:calls[n] + 1], externals=self.externals, slots=self.slots,
                    first_form=self.first_form, unreplayable=self.unreplayable, inputs=self.inputs)

    # -- a repro bundle's copy ----------------------------------------------------------------------------------
    def portable(self) -> Tape:
        """This tape as a repro bundle keeps it: no weak references, each outside tensor held by value (a view
        copied alone, not the storage under it: a slice of a whole dataset). Raises NotReplayable where the
        script changed an outside tensor in place since it used it (its value then is gone)."""
        externals = []
        for tensor, version in self.externals:
            if version is not None and tensor._version != version:
                raise NotReplayable(f"the script changed a {tuple(tensor.shape)} tensor in place after using it, so "
                                    f"its value then is gone")
            value = tensor.detach()
            whole = value.untyped_storage().nbytes() == value.numel() * value.element_size()
            externals.append((value if whole and value.is_contiguous() else value.clone(), None))
        return Tape(entries=self.entries, externals=externals, slots=self.slots, backward=self.backward,
                    first_form=self.first_form, step_location=self.step_location, stepped=self.stepped,
                    previous=self.previous.portable() if self.previous is not None else None, inputs=self.inputs,
                    unreplayable=self.unreplayable, backward_autocast=self.backward_autocast,
                    scale_slots=self.scale_slots)

    def to(self, device: torch.device) -> Tape:
        """A portable tape's outside tensors on `device` (a bundle replayed on another device than the run's)."""
        self.externals = [(tensor.to(device), version) for tensor, version in self.externals]
        if self.previous is not None:
            self.previous.to(device)
        return self

    # -- replay -------------------------------------------------------------------------------------------------
    def replay(self, call_model, first_args: tuple, first_kwargs: dict, previous: list | None = None) -> list:
        """Call every entry again; the first model call gets (first_args, first_kwargs) (the captured batch) ->
        the slot values. `previous`: an update's, the replayed values of the micro-batch tape it follows. Raises
        NotReplayable where the replay cannot follow the run."""
        if self.unreplayable is not None:
            raise NotReplayable(self.unreplayable)
        self._previous_values, self._model, self.diverged = previous or [], call_model, None
        values: list = [None] * self.slots
        given = [t for t in tree_flatten((first_args, first_kwargs))[0] if isinstance(t, torch.Tensor)]
        if len(given) != len(self.inputs):
            raise NotReplayable(f"the model took {len(self.inputs)} tensors in the run, {len(given)} in the replay")
        for (slot, wants_grad), t in zip(self.inputs, given):
            values[slot] = t.requires_grad_(True) if wants_grad and t.is_leaf else t
        first = True
        # a grad mode the tape's code set stays inside its replay: a tape can end inside a `with torch.no_grad()`
        # (a loop's own update ends at its validation's first forward), which must not leave the next replay's
        # forward without gradients
        with torch.set_grad_enabled(torch.is_grad_enabled()):
            for entry in self.entries:
                if entry.func is MODEL:
                    if first:
                        args, kwargs = first_args, first_kwargs
                    else:
                        args, kwargs = self._decode(entry.leaves, entry.spec, values)
                    first = False
                    called = call_model if entry.member is None else call_model.get_submodule(entry.member)
                    with forward_as(called, entry.forward), autocast_as(entry.autocast), \
                            replayed_at(entry.location):
                        out = called(*args, **kwargs)
                else:
                    args, kwargs = self._decode(entry.leaves, entry.spec, values)
                    with replayed_at(entry.location), autocast_as(entry.autocast):
                        out = entry.func(*args, **kwargs)
                self._fill(entry, out, values)
        return values

    def backward_args(self, values: list, scaled: bool = True) -> tuple[tuple, dict]:
        """The replayed backward() call's arguments; scaled=False: the loss a GradScaler scaled in its place."""
        if self.backward is None:
            raise NotReplayable("the script called no backward() in this micro-batch")
        if not scaled and self.scale_slots is not None:
            values = list(values)
            values[self.scale_slots[0]] = values[self.scale_slots[1]]
        return self._decode(*self.backward, values)

    def _fill(self, entry: Entry, out, values: list) -> None:
        leaves = [out] if isinstance(out, torch.Tensor) else tree_flatten(out)[0]
        if len(leaves) != len(entry.outputs):
            name = "the model" if entry.func is MODEL else getattr(entry.func, "__name__", str(entry.func))
            raise NotReplayable(f"{name} returned {len(leaves)} values in the replay, {len(entry.outputs)} in the run")
        for slot, value in zip(entry.outputs, leaves):
            if slot is not None:
                values[slot] = value
        if self.diverged is None and entry.dtypes is not None:
            for i, (value, dtype) in enumerate(zip(leaves, entry.dtypes)):
                if dtype is not None and isinstance(value, torch.Tensor) and value.dtype != dtype:
                    self.diverged = self._divergence(entry, i, value.dtype, dtype)
                    break

    @staticmethod
    def _divergence(entry: Entry, index: int, replayed: torch.dtype, ran: torch.dtype) -> str:
        """The first output whose dtype is not the run's, in words."""
        name = "the model's forward" if entry.func is MODEL else f"`{getattr(entry.func, '__name__', entry.func)}`"
        where = f" at {entry.location[0].rsplit('/', 1)[-1]}:{entry.location[1]}" if entry.location else ""
        which = f"output {index + 1}" if index else "its output"
        return (f"The replay diverged from the run in precision: {name}{where} gave {which} in "
                f"{dtype_name(replayed)} where the run's was {dtype_name(ran)} (the autocast state or the dtypes "
                f"the replay ran in are not the run's), so the op named is the replay's.")

    def _decode(self, leaves: list, spec, values: list) -> tuple[tuple, dict]:
        out = []
        for kind, x in leaves:
            if kind == "s":
                if values[x] is None:
                    raise NotReplayable("a value the run computed was not made again by the replay")
                out.append(values[x])
            elif kind == "m":
                if x >= len(self._previous_values) or self._previous_values[x] is None:
                    raise NotReplayable("the update used a value of the last micro-batch that was not replayed")
                out.append(self._previous_values[x])
            elif kind == "x":
                tensor, version = self.externals[x]
                if version is None:  # a clone: fresh for every replay (the replay may change it in place)
                    tensor = tensor.clone()
                elif tensor._version != version:
                    raise NotReplayable(f"the script changed a {tuple(tensor.shape)} tensor in place after using it "
                                        f"in this micro-batch, so its value then is gone")
                out.append(tensor)
            elif kind == "a":
                out.append(attribute(self._model, *x))
            elif kind == "k":
                out.append(stashed(*x))
            else:  # "p" (a live parameter) or "c" (a constant)
                out.append(x)
        return tree_unflatten(out, spec)


def batch_form(args: tuple, kwargs: dict) -> str:
    """How a forward's arguments became one batch (model_calls.batch_of), to give them back to the model the same
    way."""
    if kwargs and not args:
        return "kwargs"
    if not kwargs:
        return "single" if len(args) == 1 else "list"
    return "both"


def call_arguments(batch, form: str) -> tuple[tuple, dict]:
    """The inverse of model_calls.batch_of for the recorded `form`."""
    if form == "kwargs":
        return (), dict(batch)
    if form == "single":
        return (batch,), {}
    if form == "list":
        return tuple(batch), {}
    rest = dict(batch)
    return tuple(rest.pop("args")), rest
