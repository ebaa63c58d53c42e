"""Tier 2, the operator-level tracer: used only to replay the failing micro-batch.

A TorchDispatchMode sees every aten operation, in forward, loss, backward and the optimizer. An ORIGIN is
  * an op whose output holds a NaN while no input held a NaN, or
  * an op whose output holds an Inf while no input held an Inf (`deliberate` when a scalar argument is +-inf:
    the -inf that masked_fill / fill / full / where write for masking), or
  * a tensor that is already non-finite when the replay meets it: marked by the driver (`mark`: a batch tensor,
    a parameter) or met as an op input (a buffer, a constant made outside the traced ops).
Every non-finite value carries the origins it descends from (provenance.Lineage, by storage), so the driver asks,
once harm is reached, for the earliest origin IN THE LINEAGE OF THE HARMED VALUE (`origin_of`); origins whose
values never reach harm are ignored. A NaN origin remembers the Inf origins its inputs carried (`inf_sources`),
a backward origin the forward origin of its autograd node (`forward_origin`: log(0) = -inf in the forward,
hidden by torch.where, then 0/0 in LogBackward), and any birth the origins behind its finite inputs
(`ancestors`: finite values made from non-finite ones, rsqrt(inf) = 0 in a norm), so the lineage reaches back to
the root; Infs written on purpose (masks) are left out unless nothing else is there. `first` (the first origin in
time) is kept for callers that stop there.
Module context (module_context.py): each autograd node is tagged with the module that ran the op creating it, so
backward ops belong to the innermost module whose forward made them; anomaly mode keeps each node's forward
traceback, which gives backward ops their source line.
The finite path costs one aminmax per op output; lineage work begins with the first non-finite value.
"""

from __future__ import annotations

import warnings
import weakref

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map

from debug_nan.engine.sharded import has_fsdp
from debug_nan.engine.stats import flat_tensors
from debug_nan.engine.trace.events import (
    OVERWRITING,
    UNINITIALISED,
    OpEvent,
    base_arg_name,
    collective_buffers,
    has_nonfinite,
    named_tensors,
    nonfinite_flags,
    op_info,
    saved_tensors,
    scalar_is_inf,
    split_foreach,
    tensor_args,
)
from debug_nan.engine.trace.module_context import LOSS_CODE, ORIGIN_TAG, TAG, ModuleContext, custom_backward_line
from debug_nan.engine.trace.module_context import forward_inside_of, forward_source_of
from debug_nan.engine.trace.provenance import NO_IDS, Lineage, covers_storage, storage_key
from debug_nan.engine.vocabulary import Phase
from debug_nan.frames import C10D_CODE, FSDP_CODE, called_from, op_frames, user_frame

__all__ = ["OpEvent", "StopReplay", "Tracer", "TAG", "forward_source_of", "OVERWRITING", "UNINITIALISED"]

LITERAL_OPS = ("lift_fresh", "lift_fresh_copy")


class StopReplay(Exception):
    """Raised from inside the traced op once the first origin is recorded (stop_at_first=True)."""


class Tracer(TorchDispatchMode):
    """Records every origin of NaN/Inf and the lineage of every non-finite value. Use as a context manager
    around the replay; `mark` the tensors that were non-finite before it; ask `origin_of(harmed tensors)`.

    `phase_override` is set by the replay driver to "optimizer" around the optimizer step; otherwise the phase is
    derived: backward while autograd runs, forward inside a module of `model`, loss outside any module.
    `keep`: how many origins keep their tensors for diagnosis (later ones keep only where they ran)."""

    def __init__(self, model: nn.Module, stop_at_first: bool = False, keep: int = 64,
                 poisoned: frozenset = frozenset()):
        super().__init__()
        self.poisoned = poisoned  # buffers the run saw turn non-finite: an Inf met in them is no deliberate mask
        self.stop_at_first = stop_at_first
        self.model = model
        self.context = ModuleContext(model, on_output=self._module_output)
        self.phase_override: str | None = None
        self.first: OpEvent | None = None  # the first origin in time (NaN birth, or an Inf from finite inputs)
        self.ops_seen = 0
        self.module_inf: OpEvent | None = None  # a deliberate Inf (a mask) that reached a module output
        # module outputs that held NaN/Inf: (path, the origins they descend from), in order, at most 64
        self.nonfinite_outputs: list[tuple[str, frozenset]] = []
        self.lineage = Lineage(keep, private=has_fsdp(model))
        self._last_inf: OpEvent | None = None
        self.consequence: OpEvent | None = None  # the last origin_of()'s, by finite values (Lineage.consequence)
        self._state_names: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # storage -> "parameter `w`"
        self._anomaly = None

    @property
    def origins(self) -> list[OpEvent]:
        """Every origin recorded so far, in the order they happened."""
        return self.lineage.origins

    # -- the driver's questions ----------------------------------------------------------------------------------
    def mark(self, tensor: torch.Tensor, label: str, phase: str = "data") -> OpEvent | None:
        """Register a tensor that is non-finite before the traced code uses it (a batch tensor: phase "data"; a
        parameter or optimizer state: phase "optimizer") as an origin, so lineage can end there. Returns the
        origin, or None when the tensor is finite."""
        with _disable_current_modes():
            ((nan, inf),) = nonfinite_flags([tensor])
            if not (nan or inf):
                return None
            root_type, root_class = self.context.module_class("")
            event = self.lineage.add(OpEvent(
                op="", phase=phase, module="", module_type="", kind="nan" if nan else "inf", source=None,
                source_line=None, backward_node=None, forward_source=None, inputs=[],
                outputs=[(label, tensor.detach())], seq=self.ops_seen, label=label, module_class=root_class))
            self.lineage.assign(tensor, frozenset([event.id]) if nan else NO_IDS,
                                frozenset([event.id]) if inf else NO_IDS, replace=covers_storage(tensor))
        return event

    def mark_tree(self, tree, what: str, phase: str = "data") -> list[OpEvent]:
        """mark() every tensor in a nest (a batch dict, a list of parameters), labelled "{what} `{path}`"."""
        marks = [self.mark(t, f"{what} `{path}`" if path else what, phase) for path, t in flat_tensors(tree)]
        return [m for m in marks if m is not None]

    def reached(self, event: OpEvent, named: dict[str, torch.Tensor]) -> list[str]:
        """The names of the given tensors (parameters, states, loss parts) whose non-finite values descend from
        `event`: where an origin's values ended up, without relying on the identity of the event's own tensors
        (copy-on-write may have replaced them)."""
        out = []
        for name, t in named.items():
            entry = self.lineage.get(t) if isinstance(t, torch.Tensor) else None
            if entry is not None and (event.id in entry[0] or event.id in entry[1]):
                out.append(name)
        return out

    def origin_of(self, tensors) -> OpEvent | None:
        """The earliest origin in the lineage of harmed values (a tensor, or any nest of them: the loss and its
        parts, gradients, parameters, optimizer states), leaving out Infs written on purpose (masks) unless
        nothing else is there (Lineage.earliest says which lineage). None when no harmed value is non-finite or
        none was made under the tracer."""
        flat = [t for t in tree_flatten(tensors)[0] if isinstance(t, torch.Tensor)]
        with _disable_current_modes():
            nan_ids, inf_ids, any_nan = self.lineage.carried(flat)
        origin = self.lineage.earliest(nan_ids, inf_ids, any_nan)
        self.consequence = self.lineage.consequence(origin) if origin is not None else None
        return origin

    def _module_output(self, output, path: str = "") -> None:
        """After each module's forward: does the last deliberate Inf (a mask) reach a module output? And, once any
        value is non-finite, which module outputs hold NaN/Inf (`nonfinite_outputs`: a finding must not say the
        value was hidden before every module output when one showed it)."""
        if len(self.lineage) and len(self.nonfinite_outputs) < 64:
            with _disable_current_modes():
                flat = [t for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor)]
                entries = [self.lineage.get(t) if nan or inf else None for t, (nan, inf) in
                           zip(flat, nonfinite_flags(flat))]
                ids = {i for e in entries if e is not None for i in e[0] | e[1]}
                if ids:
                    self.nonfinite_outputs.append((path, frozenset(ids)))
        if self.first is None and self.module_inf is None and self._last_inf is not None:
            with _disable_current_modes():
                for t in tree_flatten(output)[0]:
                    if isinstance(t, torch.Tensor) and nonfinite_flags([t])[0][1]:
                        self.module_inf = self._last_inf
                        break

    @property
    def stack(self) -> list[str]:
        return self.context.stack

    def __enter__(self):
        self.context.attach()
        for kind, named in (("parameter", self.model.named_parameters()), ("buffer", self.model.named_buffers())):
            for name, t in named:
                self._state_names[storage_key(t)] = (kind, name)
        self._anomaly = torch.autograd.set_detect_anomaly(True, check_nan=False)
        warnings.filterwarnings("ignore", message=".*anomaly.*")
        warnings.filterwarnings("ignore", message="Error detected in")  # anomaly mode on a stopped replay
        self._anomaly.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._anomaly.__exit__(None, None, None)
            self.context.detach()

    # -- where are we ----------------------------------------------------------------------------------------
    def _context(self) -> tuple[str, str, object]:
        """(phase, module path, running autograd node or None)."""
        if self.phase_override:
            return self.phase_override, "", None
        node = torch._C._current_autograd_node()
        if node is not None:  # (an untagged custom Function's node was applied in the loss code, outside every module)
            return "backward", node.metadata.get(TAG, LOSS_CODE if hasattr(node, "_forward_cls") else ""), node
        if self.stack:
            return "forward", self.context.current(), None
        return "loss", "", None

    # -- the interception ------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        self.context.tag_pending()
        if self.stop_at_first and self.first is not None:
            return func(*args, **kwargs)
        self.ops_seen += 1
        info = op_info(func)
        if info.name in UNINITIALISED:  # garbage by definition; what is written into it later is judged
            return func(*args, **kwargs)
        buffers = collective_buffers(func, args, kwargs)
        if buffers is not None or called_from(C10D_CODE):
            # a collective and the ops carrying it out (maybe after it returns): its buffers carry this rank's own
            # share; their old contents (FSDP's garbage) are none, what other ranks sent is judged where used
            out = func(*args, **kwargs)
            if buffers is not None:
                self.lineage.collected(*buffers, out)
            return out
        written, before = [], None
        if info.mutable and not info.overwriting:
            # judging an in-place op needs its destinations' values from before it: for a foreach op over a whole
            # optimizer's lists (AdamW's exp_avgs, params), one element at a time, so the copy is one tensor's size
            calls = split_foreach(func, args, kwargs)
            if calls is not None:
                self.ops_seen -= 1  # each element is traced (and counted) as an op of its own
                for sub_args, sub_kwargs in calls:
                    self.__torch_dispatch__(func, types, sub_args, sub_kwargs)
                return None
        if info.mutable:  # an in-place op overwrites its input: judge the inputs as they were before it ran
            tensors, _ = named_tensors(func, args, kwargs)
            written = [t for n, t in tensors if base_arg_name(n) in info.written]
            self.lineage.protect(written)
            dests = {id(t) for t in written}
            # (name, tensor, its value before the op): only the destinations need a copy
            before = [(n, t, t.detach().clone() if id(t) in dests else t) for n, t in tensors
                      if base_arg_name(n) != "out" and not (info.overwriting and base_arg_name(n) == "self")]
        out = func(*args, **kwargs)
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        seen = {id(t) for t in outs}
        returned = len(outs)
        outs += [t for t in written if id(t) not in seen]
        pending = None if self.phase_override else self.context.remember(outs, written)
        bad = [t for t in outs if has_nonfinite(t)]
        # an op that writes a buffer non-finite (BatchNorm's running_var) gives it its own lineage in _judge: its
        # finite results descend from what its inputs descended from BEFORE it
        descent = self.lineage.ancestry([t for _, t, _ in before]) if bad and written and len(bad) < len(outs) else None
        if bad:
            event = self._judge(func, args, kwargs, outs, bad, written, before, returned)
            if pending is not None:
                pending[2] = event
        elif written and len(self.lineage):
            self.lineage.cleared(written)
        if self.lineage.real and len(bad) < len(outs):  # finite results of non-finite or descended values
            inputs = [t for _, t, _ in before] if before is not None else tensor_args(args, kwargs)
            self.lineage.descend(inputs, outs, bad, written, descent)
        return out

    def _judge(self, func, args, kwargs, outs, bad, written, before, returned) -> OpEvent | None:
        """A non-finite output: is this op an origin (-> its OpEvent), and which origins does each non-finite
        output carry? (`outs`: the `returned` results, then the arguments the op only wrote, named as such.)"""
        tensors, scalars = named_tensors(func, args, kwargs)
        out_names = [f"out[{i}]" if returned > 1 else "out" for i in range(returned)] + [
            next((n for n, a in tensors if a is t), "out") for t in outs[returned:]]
        if before is not None:
            names, originals, values = [n for n, _, _ in before], [t for _, t, _ in before], [c for _, _, c in before]
        else:
            names, originals, values = [n for n, _ in tensors], [t for _, t in tensors], [t for _, t in tensors]
        flags = nonfinite_flags(values + bad)  # one host sync for inputs and outputs
        in_flags, out_flags = flags[:len(values)], flags[len(values):]
        in_nan, in_inf = any(f[0] for f in in_flags), any(f[1] for f in in_flags)
        out_nan, out_inf = any(f[0] for f in out_flags), any(f[1] for f in out_flags)
        inf_scalar = scalar_is_inf(scalars)
        nan_src, inf_src = set(), set()
        for name, original, value, (nan, inf) in zip(names, originals, values, in_flags):
            if nan or inf:
                nan_ids, inf_ids = self._lineage_of(original, value, name, func, nan, inf)
                nan_src |= nan_ids if nan else NO_IDS
                inf_src |= inf_ids if inf else NO_IDS
        nan_birth, inf_birth = out_nan and not in_nan, out_inf and not in_inf
        event = None
        if nan_birth or inf_birth:
            deliberate = inf_scalar and not nan_birth
            clones = {id(t): c for _, t, c in before if c is not t} if before is not None else {}
            swap = lambda v: clones.get(id(v), v) if isinstance(v, torch.Tensor) else v  # noqa: E731
            event = self._record(func, "nan" if nan_birth else "inf", list(zip(names, values)), outs, scalars,
                                 tree_map(swap, args), tree_map(swap, kwargs), deliberate, out_names)
            if nan_birth:
                event.inf_sources = sorted((self.origins[i] for i in inf_src), key=lambda e: (e.seq, e.id))
            event.ancestors = self.lineage.ancestors(originals)
            if self.first is None and (nan_birth or not (out_nan or in_nan or in_inf or inf_scalar)):
                self.first = event  # today's "first birth in time": a NaN birth or an Inf from finite inputs
            if deliberate and not (out_nan or in_nan or in_inf):
                self._last_inf = event
        born = frozenset([event.id]) if event is not None else NO_IDS
        new_nan = frozenset(nan_src) | (born if nan_birth else NO_IDS)
        new_inf = frozenset(inf_src) | (born if inf_birth else NO_IDS)
        written_ids, bad_ids = {id(t) for t in written}, {id(t) for t in bad}
        for t, (nan, inf) in zip(bad, out_flags):
            self.lineage.assign(t, new_nan if nan else NO_IDS, new_inf if inf else NO_IDS,
                                replace=id(t) in written_ids and covers_storage(t))
        self.lineage.cleared([t for t in written if id(t) not in bad_ids])
        if self.stop_at_first and event is not None and self.first is event:
            raise StopReplay
        return event

    def _lineage_of(self, original, value, name, func, nan: bool, inf: bool) -> tuple[frozenset, frozenset]:
        """The origins a non-finite input carries; one nobody traced (a buffer, a constant) is an origin where met."""
        nan_ids, inf_ids = self.lineage.get(original) or (NO_IDS, NO_IDS)
        missing_nan, missing_inf = nan and not nan_ids, inf and not inf_ids
        # (met in FSDP's own code: a buffer it re-allocated, garbage its all-gather overwrites, is no origin)
        if (missing_nan or missing_inf) and not (self.lineage.private and called_from(FSDP_CODE)):
            event = self._adopt(original, value, name, func, missing_nan)
            own = frozenset([event.id])
            nan_ids, inf_ids = nan_ids | (own if missing_nan else NO_IDS), inf_ids | (own if missing_inf else NO_IDS)
            self.lineage.assign(original, nan_ids, inf_ids, replace=False)
        return nan_ids, inf_ids

    def _adopt(self, original, value, name, func, nan: bool) -> OpEvent:
        op = op_info(func).name
        phase, module, node = self._context()
        kind, state = self._state_names.get(storage_key(original), (None, None))
        if kind == "parameter":
            label, phase = f"parameter `{state}`", "optimizer"
        elif kind == "buffer":
            label, module = f"buffer `{state}`", state.rsplit(".", 1)[0] if "." in state else ""
        elif op in LITERAL_OPS:
            label = "a tensor literal (torch.tensor of Python numbers)"
        else:
            label = f"input `{name}` of {func}, a tensor made outside the traced ops"
        source, code = (forward_source_of(node), None) if node is not None else user_frame()
        module_type, module_class = self.context.module_class(module)  # ("" for LOSS_CODE: no such module)
        return self.lineage.add(OpEvent(
            op="", phase=phase, module="" if module == LOSS_CODE else module,
            module_type=module_type if phase != Phase.LOSS else "",
            kind="nan" if nan else "inf", source=source,
            source_line=code, backward_node=None, forward_source=None, inputs=[], outputs=[(label, value.detach())],
            seq=self.ops_seen, label=label, module_class=module_class,
            deliberate=not nan and kind != "parameter" and state not in self.poisoned))

    def _record(self, func, kind, inputs, outs, scalars, args, kwargs, deliberate, out_names) -> OpEvent:
        phase, module, node = self._context()
        shown, inside = op_frames()
        source, code = shown or (None, None)
        forward_source = None
        saved = {}
        forward_origin = None
        if node is not None:
            forward_source = forward_source_of(node)
            custom = custom_backward_line(node)
            source, code = custom or (forward_source, None)
            inside = None if custom else forward_inside_of(node)
            saved = saved_tensors(node)
            if ORIGIN_TAG in node.metadata:
                forward_origin = self.origins[node.metadata[ORIGIN_TAG]]
        module_type, module_class = self.context.module_class(module)  # ("" for LOSS_CODE: no such module)
        return self.lineage.add(OpEvent(
            op=str(func), phase=phase, module="" if module == LOSS_CODE else module,
            module_type=module_type if phase != Phase.LOSS else "",
            kind=kind, source=source, source_line=code, backward_node=node.name() if node is not None else None,
            forward_source=forward_source, inputs=[(n, t.detach()) for n, t in inputs],
            outputs=[(n, t.detach()) for n, t in zip(out_names, outs)],
            scalars={k: v for k, v in scalars.items() if not isinstance(v, torch.Tensor)}, func=func, node=node,
            args=args, kwargs=kwargs, saved=saved, seq=self.ops_seen, deliberate=deliberate,
            module_class=module_class, forward_origin=forward_origin,
            inside=inside[0] if inside else None, inside_line=inside[1] if inside else None))
