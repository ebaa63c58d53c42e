"""Data-flow provenance for the tracer: which origins each non-finite value descends from.

Lineage is tracked per STORAGE, not per tensor object: a view, an in-place op, an `out=` op and a tensor that
autograd saved for backward all share their base's storage, so they share its lineage. Each storage that ever held
a non-finite value maps to two sets of origin ids, NaN origins and Inf origins (a NaN's lineage and an Inf's
differ: the -inf of a mask is the Inf origin, the softmax that turned an all -inf row into NaN the NaN origin).
Storages that stayed finite have no entry, so the finite path costs nothing. The map is weak: a freed storage
drops its entry, and a new allocation at the same address is a new key.

Granularity is the storage: a non-finite view of a storage whose other regions hold values of other origins
inherits those origins too (a superset, never a miss).

Descent: a finite value computed from non-finite or descended ones (1/sqrt(inf) = 0 in a norm whose x.pow(2)
overflowed) keeps the origins it came from, in a third map, so that a later birth from such finite values (the
backward of that norm overflowing on the huge stream) lists them as its `ancestors`: the earliest birth in the
harmed value's lineage is then the forward overflow, not its consequence. Integer and bool results (a mask made
by isfinite) carry no descent: no value of the origin flows through them; nor do Infs written on purpose (masks).
Nothing of this runs before the replay's first origin that is not a mask.
"""

from __future__ import annotations

import weakref
from collections import deque

import torch
from torch.utils._pytree import tree_flatten, tree_map

from debug_nan.engine.trace.events import OpEvent, has_nonfinite, nonfinite_flags

NO_IDS: frozenset = frozenset()


def storage_key(t: torch.Tensor):
    """The storage object (one Python object per storage, kept alive as long as the storage is), or the tensor
    itself for tensors without a storage (sparse, some subclasses)."""
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):
        return t


def covers_storage(t: torch.Tensor) -> bool:
    """Does writing t overwrite its whole storage (so the storage's old lineage is gone)?"""
    try:
        return t.numel() * t.element_size() >= t.untyped_storage().nbytes()
    except (RuntimeError, NotImplementedError, TypeError):
        return True


def whole_storage(t: torch.Tensor) -> torch.Tensor:
    """All of t's storage as a flat tensor of t's dtype (to re-judge it after a partial in-place write)."""
    storage = t.untyped_storage()
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(storage, 0, (storage.nbytes() // t.element_size(),))


def _own_copies(event: OpEvent) -> None:
    """Give `event` its own copy of every tensor it keeps (inputs, outputs, saved tensors, the call's arguments)."""
    copies: dict[int, torch.Tensor] = {}

    def own(v):
        if not isinstance(v, torch.Tensor):
            return v
        if id(v) not in copies:
            copies[id(v)] = v.detach().clone()
        return copies[id(v)]

    event.inputs = [(n, own(t)) for n, t in event.inputs]
    event.outputs = [(n, own(t)) for n, t in event.outputs]
    event.saved = {k: own(t) for k, t in event.saved.items()}
    event.args, event.kwargs = tree_map(own, event.args), tree_map(own, event.kwargs)


class Lineage:
    """Storage -> (NaN origin ids, Inf origin ids); the origins themselves; copy-on-write of their tensors.

    Origins beyond `keep` are still recorded (op, phase, module, source) so lineage stays complete, but their
    tensors are dropped to bound memory; their `note` says so."""

    def __init__(self, keep: int = 64, private: bool = False):
        self.origins: list[OpEvent] = []
        self.keep = keep
        # private: each kept origin's tensors are copied at once (FSDP frees an unsharded parameter's storage after
        # its unit's forward and backward, which no in-place op announces: a kept reference would read freed memory)
        self.private = private
        self.dropped = 0
        self._sets: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._pins: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # storage -> [(event, field, index)]
        self._descent: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # finite storage -> origin ids
        self.real = 0  # origins not written on purpose: descent is tracked from the first one on
        self._parents: dict[int, tuple[OpEvent, str]] = {}  # the last earliest(): event id -> (who led there, how)
        self.harm_lineage: frozenset = NO_IDS  # the last earliest(): every origin in the harm's lineage

    def __len__(self) -> int:
        return len(self._sets)

    # -- origins ---------------------------------------------------------------------------------------------------
    def add(self, event: OpEvent, pin: bool = True) -> OpEvent:
        """Register an origin (assigns event.id). `pin`: protect its input/output tensors from later in-place
        writes (False for tensors that are private clones already)."""
        event.id = len(self.origins)
        self.origins.append(event)
        self.real += not event.deliberate
        if event.id >= self.keep:
            self.dropped += 1
            event.inputs, event.outputs, event.saved, event.args, event.kwargs = [], [], {}, (), {}
            event.node = None
            event.note = (f"origin #{event.id + 1}, beyond the first {self.keep} of this replay: its tensors were not "
                          f"kept, so the evidence is limited to the op and where it ran.")
            return event
        if self.private:
            _own_copies(event)
            return event
        for field in (("outputs", "inputs") if pin else ("outputs",)):
            for i, (_, t) in enumerate(getattr(event, field)):
                self._pins.setdefault(storage_key(t), []).append((event, field, i))
        return event

    def protect(self, written: list[torch.Tensor]) -> None:
        """Before an op writes into these tensors: give every kept origin that references their storage its own
        copy, so its evidence stays what it was when it happened."""
        if not self._pins:
            return
        for t in written:
            for event, field, i in self._pins.pop(storage_key(t), ()):
                entries = getattr(event, field)
                name, old = entries[i]
                copy = old.detach().clone()
                entries[i] = (name, copy)
                swap = lambda v, old=old, copy=copy: copy if v is old else v  # noqa: E731
                event.args, event.kwargs = tree_map(swap, event.args), tree_map(swap, event.kwargs)

    # -- the per-storage sets ----------------------------------------------------------------------------------------
    def get(self, t: torch.Tensor) -> tuple[frozenset, frozenset] | None:
        return self._sets.get(storage_key(t))

    def assign(self, t: torch.Tensor, nan_ids: frozenset, inf_ids: frozenset, replace: bool) -> None:
        """t now holds non-finite values of these origins. `replace`: t was written whole (its storage's old
        lineage is gone); otherwise the old lineage of the storage's other regions is kept alongside."""
        key = storage_key(t)
        old = None if replace else self._sets.get(key)
        if old is not None:
            nan_ids, inf_ids = nan_ids | old[0], inf_ids | old[1]
        self._sets[key] = (frozenset(nan_ids), frozenset(inf_ids))

    def ancestry(self, tensors) -> frozenset:
        """Every origin not written on purpose that the given tensors descend from, non-finite (their NaN and Inf
        sets) or finite again. (A mask's -inf is everywhere downstream of it and never the answer over a real
        birth: its descent is not tracked.)"""
        ids: set = set()
        for t in tensors:
            key = storage_key(t)
            entry, finite = self._sets.get(key), self._descent.get(key)
            if entry is not None:
                ids |= {i for i in entry[0] | entry[1] if not self.origins[i].deliberate}
            if finite is not None:
                ids |= finite
        return frozenset(ids)

    def ancestors(self, tensors) -> list[OpEvent]:
        """The origins behind the FINITE descendants among the tensors (a birth's inputs), earliest first."""
        ids: set = set()
        for t in tensors:
            ids |= self._descent.get(storage_key(t), NO_IDS)
        return sorted((self.origins[i] for i in ids), key=lambda e: (e.seq, e.id))

    def descend(self, inputs, outputs, bad, written, ids: frozenset | None = None) -> None:
        """An op's finite floating outputs (those not in `bad`) carry the origins its inputs descend from (`ids`:
        the inputs' ancestry as it was before the op, where the op wrote some of them); an output written in place
        keeps its storage's old descent unless it was written whole."""
        ids = self.ancestry(inputs) if ids is None else ids
        if not ids:
            return
        skip, dests = {id(t) for t in bad}, {id(t) for t in written}
        for t in outputs:
            if id(t) in skip or not (t.is_floating_point() or t.is_complex()):
                continue
            key = storage_key(t)
            old = self._descent.get(key) if id(t) in dests and not covers_storage(t) else None
            self._descent[key] = ids | old if old is not None else ids

    def collected(self, written: list[torch.Tensor], sent: list[torch.Tensor], returned=None) -> None:
        """A collective writes `written` whole with every rank's values from what each sent (and returns new
        tensors, a functional one: `returned`): they carry the origins of this rank's non-finite values among
        `sent` (its own share of the result); what other ranks sent is judged where this rank's code uses it. Old
        lineage and descent of the written storages end."""
        given = {id(t) for t in written + sent}
        written = written + [t for t in tree_flatten(returned)[0] if isinstance(t, torch.Tensor) and id(t) not in given]
        nan_ids, inf_ids, _ = self.carried(sent) if self._sets else (NO_IDS, NO_IDS, False)  # (no lineage: no sync)
        for t in written:
            whole = covers_storage(t)
            if whole:
                self._sets.pop(storage_key(t), None)
                self._descent.pop(storage_key(t), None)
            if nan_ids or inf_ids:
                self.assign(t, nan_ids, inf_ids, replace=whole)

    def carried(self, tensors: list[torch.Tensor]) -> tuple[frozenset, frozenset, bool]:
        """The NaN origins of the tensors that hold a NaN and the Inf origins of those that hold an Inf (one host
        sync for all), and whether one with a lineage held a NaN."""
        nan_ids, inf_ids, any_nan = set(), set(), False
        for t, (nan, inf) in zip(tensors, nonfinite_flags(tensors)):
            entry = self.get(t) if nan or inf else None
            if entry is None:
                continue
            any_nan = any_nan or nan
            nan_ids |= entry[0] if nan else NO_IDS
            inf_ids |= entry[1] if inf else NO_IDS
        return frozenset(nan_ids), frozenset(inf_ids), any_nan

    def cleared(self, written: list[torch.Tensor]) -> None:
        """These tensors were just written and are finite: their storage's lineage ends, unless other regions of
        the storage still hold non-finite values."""
        for t in written:
            key = storage_key(t)
            if key not in self._sets:
                continue
            if key is t or covers_storage(t):
                del self._sets[key]
                continue
            if not has_nonfinite(whole_storage(t)):
                del self._sets[key]

    # -- the answer ----------------------------------------------------------------------------------------------------
    def earliest(self, nan_ids: frozenset, inf_ids: frozenset, any_nan: bool) -> OpEvent | None:
        """The earliest origin in a harm's lineage that was not written on purpose, else the earliest deliberate
        one. A NaN harm's lineage: its NaN origins and the Inf origins that fed them (an overflow upstream of an
        `inf - inf` is the root, while the -inf of a mask under a fully masked softmax is not: it is deliberate,
        so the softmax is). An Inf-only harm's lineage: its Inf origins. Both: a backward origin's forward origin
        (forward_origin) and the origins behind its finite inputs (ancestors) too."""
        todo = deque((self.origins[i], None) for i in (nan_ids if any_nan and nan_ids else inf_ids))
        events, seen, self._parents = [], set(), {}
        while todo:
            e, parent = todo.popleft()  # (breadth first: the shortest way from the harm to each origin)
            if e.id in seen:
                continue
            seen.add(e.id)
            if parent is not None:
                self._parents[e.id] = parent
            events.append(e)
            todo += ([(s, (e, "inf")) for s in e.inf_sources] + [(a, (e, "descent")) for a in e.ancestors]
                     + ([(e.forward_origin, (e, "forward"))] if e.forward_origin is not None else []))
        self.harm_lineage = frozenset(seen)
        if not events:
            return None
        real = [e for e in events if not e.deliberate]
        return min(real or events, key=lambda e: (e.seq, e.id))

    def unharmed_writers(self, named) -> list[tuple[str, OpEvent]]:
        """After earliest(): (name, writer) of each of the named tensors (a model's buffers) that holds non-finite
        values none of which is in the harm's lineage: a buffer this replay wrote non-finite (BatchNorm's
        running_var) that nothing harmed read. The writer is its earliest origin not written on purpose."""
        out = []
        for name, t in named:
            entry = self._sets.get(storage_key(t))
            ids = (entry[0] | entry[1]) if entry is not None else NO_IDS
            real = [self.origins[i] for i in ids if not self.origins[i].deliberate]
            if real and not ids & self.harm_lineage:
                out.append((name, min(real, key=lambda e: (e.seq, e.id))))
        return out

    def consequence(self, origin: OpEvent) -> OpEvent | None:
        """After earliest(): where `origin` was reached only through finite values, the birth in the harm's own
        lineage that they led to (the backward overflow a forward Inf turned into once 1/sqrt(inf) = 0), else
        None."""
        event, through = origin, False
        while event.id in self._parents:
            event, how = self._parents[event.id]
            through = through or how == "descent"
        return event if through else None
