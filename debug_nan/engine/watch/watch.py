"""Tier 1, the watch: always on and cheap. A micro-batch trips on harm only.

Per micro-batch it records ON THE DEVICE: min and max of every floating batch tensor and of every module output
but those of torch.nn's weightless layers (a forward hook, one `aminmax` each: the history, and the notes on
deliberate -inf masks; only in the steps the session sets `measure_outputs` for), the loss and its logged parts,
the L2 norm of every gradient (one fused `_foreach_norm`: history, explosion check, clipping, and finiteness, since
a NaN/Inf element makes the norm NaN/Inf) and, as the
step after an optimizer step begins, one value per parameter and optimizer state tensor (norms.state_sums: a sum
or an L2 norm, non-finite when an element is). Everything is copied to the host in ONE transfer per micro-batch;
no sync per layer. A norm or a sum can overflow while every element is finite: only then a second look (max |x|
of those tensors, a second sync) settles it.

Harm, which trips: a non-finite loss (or loss part), gradient, parameter or optimizer state. Non-finite module
outputs and batch tensors are recorded, not tripped on (see MicroResult.first_harm).
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from debug_nan.engine.sharded import any_sharded, global_norms, locals_of, sharded_flags, user_path
from debug_nan.engine.stats import flat_tensors, tensor_stats
from debug_nan.engine.vocabulary import CheckKind
from debug_nan.engine.watch.buffer_watch import BufferWatch
from debug_nan.engine.watch.module_hooks import ModuleHook, keep_out_of_copies
from debug_nan.engine.watch.norms import l2_norms, param_and_state_tensors, stack64, state_sums, sum_plan
from debug_nan.engine.watch.phase_codes import NORM_KINDS as _NORM_KINDS
from debug_nan.engine.watch.phase_codes import device_code, host_code
from debug_nan.engine.watch.watch_result import HARM_KINDS, KIND_ORDER, Check, MicroResult, Segment

__all__ = ["HARM_KINDS", "Check", "MicroResult", "Watch", "l2_norms", "param_and_state_tensors"]

_NormChunk = tuple[list[str], list[torch.Tensor], list[torch.Tensor]]


def _dead_ref() -> None:
    return None


def _first_float(output) -> torch.Tensor | None:
    """The first floating tensor in a module's output (it stands for the module)."""
    return next((t for _, t in flat_tensors(output) if t.is_floating_point()), None)


def _passes_through(module: nn.Module) -> bool:
    """A layer of torch.nn without weights of its own (an activation, dropout, Identity, Flatten, Softmax, pooling,
    a loss module, a Sequential). User-defined modules (where masks are built) are not."""
    own_weights = next(module.parameters(recurse=False), None) is not None or \
        next(module.buffers(recurse=False), None) is not None
    return not own_weights and type(module).__module__.startswith("torch.nn.modules.")


class Watch:
    """Forward hooks on the modules of `model` plus explicit calls for batch, loss, gradients and parameters;
    sync() ends a micro-batch.

    Hooked: the root and every module but torch.nn's weightless layers (activations, dropout, Identity, Softmax,
    pooling, Sequential): a registered hook costs every call of its module ~10 us, as much as a small layer itself.
    A NaN born in one of those shows in the next hooked output or the loss (the history and the notes name that
    one), and the replay's tracer names its op: module outputs never trip. `detailed` (--trace-every-step) hooks
    every module."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None):
        self.model = model
        self.optimizer = optimizer
        self.module_names = {m: user_path(n) for n, m in model.named_modules()}  # (as the user wrote them)
        self.named_params = [(user_path(n), p) for n, p in model.named_parameters() if p.requires_grad]
        # FSDP2 / DTensor: each rank reads its own shards, and gradient norms are summed over the ranks
        self.sharded = any_sharded(p for _, p in self.named_params)
        self.hooked = [m for m in self.module_names if m is model or not _passes_through(m)]
        self.enabled = True
        self._measure = True  # module outputs measured this step (see measure_outputs)
        self._wanted = False  # attach() was called and close() was not: the hooks are registered when measuring
        self.hook_seconds, self.hook_calls = 0.0, 0  # time in the forward hooks, and their calls (what measuring
        # module outputs costs: the session's output schedule weighs it)
        self.exact_grad_norms = False  # True: torch's own norms, bit for bit (the Trainer's clipping reuses them)
        self._detailed = False  # trace-every-step: full statistics per module output (syncs per layer)
        self._handles: list = []
        self._on_output_hook = ModuleHook(self._on_output)  # one object: not copied with the model, not compiled
        self._state_key: list[int] | None = None
        self._named_cache: tuple[list[str], list[torch.Tensor]] = ([], [])
        self._sum_plan: list[int] = []
        self.buffers = BufferWatch(model)  # which buffers went non-finite (read in the same one sync)
        self._anchor = next(model.parameters(), None)
        self.discard()
        self.attach()

    @property
    def detailed(self) -> bool:
        return self._detailed

    @detailed.setter
    def detailed(self, on: bool) -> None:
        """Full statistics of every module's output (each a host sync): every module is hooked then."""
        self._detailed = on
        self._hook(rehook=True)  # (the hooked set changes)

    @property
    def measure_outputs(self) -> bool:
        return self._measure

    @measure_outputs.setter
    def measure_outputs(self, on: bool) -> None:
        """Measure the module outputs from now on, or leave them out (the session's output schedule): then no hook
        is registered at all (one that returns at once still takes its module off torch's fast call path: ~4 us a
        call, 0.9 ms a forward on a 300-module model)."""
        self._measure = on
        self._hook()

    def attach(self) -> None:
        """Register the forward hooks (done by the constructor; again after close())."""
        self._wanted = True
        self._hook()

    def close(self) -> None:
        """Remove the forward hooks: the model runs as if never watched."""
        self._wanted = False
        self._hook()

    def _hook(self, rehook: bool = False) -> None:
        """Hooks registered exactly while attached and measuring (or detailed): the one place that decides."""
        on = self._wanted and (self._measure or self._detailed)
        if rehook or not on:
            for h in self._handles:
                h.remove()
            self._handles = []
        if on and not self._handles:
            modules = self.module_names if self._detailed else self.hooked
            for m in modules:
                keep_out_of_copies(m)
            self._handles = [m.register_forward_hook(self._on_output_hook) for m in modules]

    @contextmanager
    def paused(self):
        """Record nothing inside (a replay runs the model again), then forget what was recorded and restore the
        previous state."""
        was = self.enabled
        self.enabled = False
        try:
            yield
        finally:
            self.enabled = was
            self.discard()

    def discard(self) -> None:
        """Forget everything recorded since the last sync."""
        self._modules: list[nn.Module] = []  # module outputs measured, in call order, and their (min, max)
        self._minmax: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._last_output = _dead_ref
        self._data: list[tuple[str, tuple[torch.Tensor, torch.Tensor]]] = []
        self._scalars: dict[str, list[tuple[str, torch.Tensor]]] = {CheckKind.LOSS: [], CheckKind.LOSS_PART: []}
        # kind -> chunks of (names, 0-d L2 norms, the tensors themselves for a second look)
        self._norms: dict[str, list[_NormChunk]] = {kind: [] for kind in _NORM_KINDS}
        self._layer_stats: dict[str, object] = {}

    # -- recording (all on the device) -------------------------------------------------------------------------
    def _on_output(self, module: nn.Module, inputs, output) -> None:
        if not self.enabled:
            return
        started = time.perf_counter()
        self.hook_calls += 1
        # the common case, a single tensor, without a generic walk of the output
        t = output if type(output) is torch.Tensor else _first_float(output)
        if t is None or not t.is_floating_point() or t.numel() == 0:
            return
        self._modules.append(module)
        if self._last_output() is t:  # a parent passing its child's output on: measured already
            self._minmax.append(self._minmax[-1])
        else:
            self._minmax.append(torch.aminmax(t.detach()))
            self._last_output = weakref.ref(t)  # weak: holding the output would keep it alive through backward
        if self._detailed:
            self._layer_stats[f"{self.module_names[module] or '<model>'} ({type(module).__name__})"] = tensor_stats(t)
        self.hook_seconds += time.perf_counter() - started

    def watch_batch(self, batch) -> None:
        for path, t in flat_tensors(batch):
            if t.is_floating_point() and t.numel():
                self._data.append((path, torch.aminmax(t.detach())))

    def watch_loss(self, loss: torch.Tensor, parts: dict[str, torch.Tensor] | None = None) -> None:
        self._scalars[CheckKind.LOSS].append(("", loss.detach().reshape(())))
        for name, value in (parts or {}).items():
            self._scalars[CheckKind.LOSS_PART].append((name, value.detach().reshape(())))

    def watch_grads(self, inverse_scale: torch.Tensor | None = None) -> list[torch.Tensor] | None:
        """The L2 norm of every gradient, one fused pass: recorded, and returned so that clipping reuses them.
        `inverse_scale` (0-d, on the device): gradients still multiplied by an fp16 loss scale are recorded
        unscaled (a NaN/Inf stays one)."""
        named = [(n, p.grad) for n, p in self.named_params if p.grad is not None]
        if not named:
            return None
        grads = [g for _, g in named]
        flags = sharded_flags(grads) if self.sharded else None
        grads = locals_of(grads) if self.sharded else grads
        with torch.no_grad():  # a gradient of a create_graph backward requires grad itself
            norms = l2_norms(grads, self.exact_grad_norms)
            if flags is not None:  # the global norms, as clip_grad_norm_ computes them over DTensors
                norms = list(global_norms(torch.stack(norms), torch.tensor(flags, device=norms[0].device)))
            if inverse_scale is not None:
                norms = list(torch._foreach_mul(norms, inverse_scale.to(norms[0].device, torch.float32)))
        self._norms[CheckKind.GRAD].append(([n for n, _ in named], norms, grads))
        return norms

    def watch_params(self) -> None:
        """After an optimizer step: one value per parameter and optimizer state tensor, non-finite when an element
        is (norms.state_sums; read at the next sync)."""
        names, tensors = self._param_and_state()
        if tensors:
            self._norms[CheckKind.PARAM].append((names, self._state_values(tensors), tensors))

    def read_state(self) -> tuple[list[str], np.ndarray]:
        """The parameter check's values, read now (a host sync): what a sync after watch_params() reads, for
        checking that a re-run reached the run's state (engine/replay/catch_up.py)."""
        names, tensors = self._param_and_state()
        if not tensors:
            return list(names), np.zeros(0)
        values = stack64(self._state_values(tensors), self._home_device())
        return list(names), np.asarray(values.tolist(), dtype=np.float64)

    def _state_values(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        with torch.no_grad():
            return state_sums(tensors, self._sum_plan)

    def _param_and_state(self) -> tuple[list[str], list[torch.Tensor]]:
        """param_and_state_tensors, rebuilt only when a state object changed: the key is the identity of every
        state value (sound, since the cache holds them and no id can be reused meanwhile)."""
        states = self.optimizer.state if self.optimizer is not None else {}
        key = [id(v) for _, p in self.named_params for v in states.get(p, {}).values()]
        if key != self._state_key:
            named = param_and_state_tensors(self.named_params, self.optimizer)
            tensors = [t for _, t in named]
            self._state_key, self._named_cache = key, ([n for n, _ in named],
                                                       locals_of(tensors) if self.sharded else tensors)
            self._sum_plan = sum_plan(self._named_cache[1])
        return self._named_cache

    # -- the one sync ------------------------------------------------------------------------------------------
    def sync(self, agree: Callable[[torch.Tensor], torch.Tensor] | None = None, raised: bool = False,
             abort: bool = False) -> MicroResult:
        """Copy this micro-batch's values to the host (the one sync) and start a new micro-batch.

        Under DDP, `agree` all-reduces this rank's 0-d phase code into a [world] tensor (e.g. a lambda over
        train.distributed.agree); the codes are computed on the device and come back in the same copy. `raised`:
        user code raised; `abort`: this rank must stop (both travel in the code)."""
        device = self._home_device()
        layout, parts = self._layout(device)
        flat = torch.cat(parts) if parts else torch.zeros(0, device=device, dtype=torch.float64)
        n = flat.numel()
        if agree is not None:
            flat = torch.cat([flat, agree(device_code(flat, layout, raised, abort)).to(flat)])
        host = np.asarray(flat.tolist(), dtype=np.float64)  # the one host sync
        segments = self._segments(layout, host[:n])
        self._second_look(layout, segments)
        new_buffers = self.buffers.settle(segments)
        codes = host[n:].tolist() if agree is not None else None
        result = MicroResult(segments, self._layer_stats, codes, new_buffers)
        if codes is not None and any(c != int(c) for c in codes):
            # some rank's norm overflowed with finite elements (rare): agree again on the settled codes
            code = torch.tensor(float(host_code(result, raised, abort)), device=device)
            result.rank_codes = agree(code).tolist()
        self.discard()
        return result

    def _home_device(self) -> torch.device:
        # the first parameter, kept: model.to() moves its data but keeps the object (a walk of every module per sync
        # to find it again costs ~0.3 ms on a 300-module model)
        if self._anchor is not None:
            return self._anchor.device
        first = next(self.model.buffers(), None)
        return first.device if first is not None else torch.device("cpu")

    def _layout(self, device: torch.device) -> tuple[list[tuple[str, list[str], int, list]], list[torch.Tensor]]:
        """[(kind, names, width, tensors for a second look)] in KIND_ORDER, and the device float64 parts."""
        layout, parts = [], []
        for kind in KIND_ORDER:
            if kind == CheckKind.BUFFER:  # the BufferWatch's, below
                continue
            if kind in _NORM_KINDS:
                chunks = self._norms[kind]
                if chunks:
                    names = [n for c in chunks for n in c[0]]
                    layout.append((kind, names, 1, [t for c in chunks for t in c[2]]))
                    parts.append(stack64([v for c in chunks for v in c[1]], device))
            elif kind in self._scalars:
                entries = self._scalars[kind]
                if entries:
                    layout.append((kind, [n for n, _ in entries], 1, []))
                    parts.append(stack64([v for _, v in entries], device))
            else:
                if kind == CheckKind.FORWARD:
                    names, pairs = [self.module_names[m] for m in self._modules], self._minmax
                else:
                    names, pairs = [n for n, _ in self._data], [p for _, p in self._data]
                if names:
                    layout.append((kind, names, 2, []))
                    parts.append(stack64([p[0] for p in pairs] + [p[1] for p in pairs], device))
        for kind, names, norms in self.buffers.record():  # last, as in KIND_ORDER
            layout.append((kind, names, 1, []))
            parts.append(stack64(norms, device))
        return layout, parts

    @staticmethod
    def _segments(layout, host: np.ndarray) -> list[Segment]:
        segments, i = [], 0
        for kind, names, width, _ in layout:
            n = len(names)
            if width == 2:
                lo, hi = host[i:i + n], host[i + n:i + 2 * n]
                nan = np.isnan(lo) | np.isnan(hi)
                value = np.where(nan, np.nan, np.maximum(-lo, hi))
                segments.append(Segment(kind, names, value, ~(np.isfinite(lo) & np.isfinite(hi)), lo, hi))
            else:
                value = host[i:i + n]
                segments.append(Segment(kind, names, value, ~np.isfinite(value)))
            i += width * n
        return segments

    @staticmethod
    def _second_look(layout, segments: list[Segment]) -> None:
        """A norm that read +Inf (or a parameter's sum that read non-finite): was an element non-finite, or did the
        sum overflow? max |x| tells (a second sync, only in this rare case). The value stays in the history; only
        the finiteness flag is corrected."""
        todo = []
        for (kind, _, _, tensors), seg in zip(layout, segments):
            if kind in _NORM_KINDS:
                # a norm overflows to +Inf only; a sum (parameters, norms.state_sums) to either, or to NaN
                ambiguous = np.isposinf(seg.value) if kind == CheckKind.GRAD else ~np.isfinite(seg.value)
                todo += [(seg, int(i), tensors[i]) for i in np.flatnonzero(ambiguous)]
        if not todo:
            return
        with torch.no_grad():
            # (a rank's shard of a small sharded parameter may be empty: FSDP pads the last ranks' shards)
            peaks = torch.stack([torch.stack(torch.aminmax(t)).to(todo[0][2].device, torch.float64).abs().max()
                                 if t.numel() else torch.zeros((), dtype=torch.float64, device=todo[0][2].device)
                                 for _, _, t in todo]).tolist()
        for (seg, i, _), peak in zip(todo, peaks):
            seg.nonfinite[i] = not np.isfinite(peak)
            if seg.kind == CheckKind.PARAM and np.isinf(peak):  # +Inf and -Inf summed to NaN: no NaN among them
                seg.value[i] = peak
