"""The state just before an optimizer step's first micro-batch, so a failing micro-batch can be replayed.

Parameters, buffers and optimizer state are copied into buffers allocated once (`_foreach_copy_`), each module's
`training` flag is kept (a submodule the user froze in eval mode replays in eval mode), the scaler/scheduler state
is kept as a dict, and the RNG state is captured before every micro-batch.

Where the copies live (`mode`, the CLI's --snapshot):
  host    pinned CPU memory. On CUDA the parameters and optimizer state are copied asynchronously on a side stream
          (non_blocking), which overlaps the step's forward and backward; the optimizer's step pre-hook makes the
          compute stream wait for that copy (a device-side event wait, no host sync) before the first write of a
          parameter, and restore() waits on the same event. Buffers (BatchNorm running statistics, written by the
          forward) are copied on the compute stream, before the forward. No device memory is used.
  device  copies on the model's device, on the compute stream (fast, but device memory: parameters + buffers +
          optimizer state, once: the Trainer keeps one snapshot, saved once the previous update is known finite).
  params  as host, without the optimizer state (the biggest part with Adam: twice the parameters): a trip in the
          forward, loss or backward replays as usual (the optimizer state cannot change before the step's
          optimizer step), an optimizer-phase trip is reported without its op (`keeps_optimizer` is False).
  off     no copy: nothing can be replayed (`kept` is False; restore() raises).
On the CPU, host and device are the same memory: both keep plain CPU copies.
"""

from __future__ import annotations

import copy
import random
from collections import defaultdict

import numpy as np
import torch

from debug_nan.engine.sharded import local, locals_of


def capture_rng(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def portable_rng(state: dict) -> dict:
    """An RNG state as a bundle keeps it: NumPy's key array as a list of ints (a bundle of plain values and tensors
    is read with torch.load(weights_only=True), which reads no NumPy array); restore_rng takes either."""
    if not isinstance(state, dict) or "numpy" not in state:
        return state
    name, keys, *rest = state["numpy"]
    return {**state, "numpy": (name, keys.tolist() if isinstance(keys, np.ndarray) else keys, *rest)}


def restore_rng(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def schedule_state(optimizer, scheduler) -> dict:
    """What a schedule changes between steps: every param group's settings but its parameters (the lr and the other
    hyperparameters live there: the scheduler writes them) and the scheduler's own state."""
    return {"groups": [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
                       for g in (optimizer.param_groups if optimizer is not None else [])],
            "scheduler": scheduler.state_dict() if scheduler is not None else None}


def put_groups(optimizer, groups: list[dict]) -> None:
    """schedule_state's param-group settings back into `optimizer` (fresh copies: a later step may change them)."""
    for group, saved in zip(optimizer.param_groups if optimizer is not None else [], groups):
        group.update(copy.deepcopy(saved))


def _scaler_state(scaler) -> dict | None:
    """The fp16 gradient scaler's state, copied on its device: scaler.state_dict() would sync (.item())."""
    if scaler is None or getattr(scaler, "_scale", None) is None:
        return None
    return {"scale": scaler._scale.clone(), "growth": scaler._growth_tracker.clone()}


def _restore_scaler(scaler, state: dict | None) -> None:
    if scaler is None:
        return
    from torch.amp.grad_scaler import _refresh_per_optimizer_state

    if state is not None:
        scaler._scale.copy_(state["scale"])
        scaler._growth_tracker.copy_(state["growth"])
    # forget "unscale_() was called" for this step, as update() does at the end of a step
    scaler._per_optimizer_states = defaultdict(_refresh_per_optimizer_state)


SNAPSHOT_MODES = ("host", "device", "params", "off")
NO_SNAPSHOT = "no snapshot (--snapshot off): the op was not replayed; rerun with --snapshot host to name it."
NO_OPTIMIZER_COPY = ("no copy of the optimizer state (--snapshot params): the optimizer step was not replayed; rerun "
                     "with --snapshot host to name its op.")


def _holder(t: torch.Tensor, host: bool) -> torch.Tensor:
    """Uninitialised memory for t's values: pinned CPU memory for a CUDA tensor in host mode, else like t."""
    if host and t.is_cuda:
        return torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
    return torch.empty_like(t.detach())


class _Copies:
    """Copies of a fixed list of tensors, allocated once. `groups` maps a CUDA device to the indices copied from it
    asynchronously (host mode, `side`), None to those copied in place on the compute stream."""

    def __init__(self, sources: list[torch.Tensor], host: bool, side: bool = True):
        self.copies = [_holder(t, host) for t in sources]
        self.groups: dict[torch.device | None, list[int]] = {}
        for i, t in enumerate(sources):
            self.groups.setdefault(t.device if host and side and t.is_cuda else None, []).append(i)

    @property
    def nbytes(self) -> tuple[int, int]:
        """(bytes on a device other than the CPU, bytes in CPU memory)."""
        on_cpu = sum(c.numel() * c.element_size() for c in self.copies if c.device.type == "cpu")
        return sum(c.numel() * c.element_size() for c in self.copies) - on_cpu, on_cpu


class Snapshot:
    """save() before each optimizer step; restore() puts model (parameters, buffers, training flags), optimizer,
    scaler and scheduler back. The optimizer may be None (the API's Monitor without one). `mode`: where the
    copies live, one of SNAPSHOT_MODES (see the module docstring)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, scaler=None,
                 scheduler=None, mode: str = "host"):
        if mode not in SNAPSHOT_MODES:
            raise ValueError(f"snapshot mode must be one of {', '.join(SNAPSHOT_MODES)}, got {mode!r}")
        self.model, self.optimizer, self.scaler, self.scheduler = model, optimizer, scaler, scheduler
        self.mode = mode
        self.kept = mode != "off"
        self.keeps_optimizer = mode in ("host", "device")  # an optimizer step can be replayed
        self._host = mode in ("host", "params")
        self._params = [p for p in model.parameters()]
        self._param_ids = {id(p) for p in self._params}
        # FSDP2 / DTensor: each rank copies and restores its own shards (the same storage as the parameter)
        self._param_data = locals_of(self._params)
        # buffers too: BatchNorm running statistics (and any custom buffer) change in every forward
        self._buffers = [b for b in model.buffers()]
        self._modules = [m for m in model.modules()]
        self._training: list[bool] = [m.training for m in self._modules]
        self._state_keys: list[tuple[int, str]] = []
        self._param_copies = self._buffer_copies = self._state = None  # _Copies, None when off
        self._other_state: dict = {}
        self._staged: _Copies | None = None  # stage(): buffers kept aside for a later save()
        self._staged_training: list[bool] | None = None
        self._side: dict[torch.device, tuple[torch.cuda.Stream, torch.cuda.Event]] = {}
        self._pending: set[torch.device] = set()
        if not self.kept:
            return
        # asynchronous only when the optimizer's pre-hook can fence the copy: without an optimizer (the API's
        # Monitor without one) whoever updates the parameters is unknown, so the copy is queued on the compute stream
        self._param_copies = _Copies([p.detach() for p in self._param_data], self._host, side=optimizer is not None)
        # buffers are written by the forward, right after save(): they go on the compute stream, in its order
        self._buffer_copies = _Copies([b.detach() for b in self._buffers], self._host, side=False)
        if optimizer is not None and any(device is not None for device in self._param_copies.groups):
            # the first write of a parameter or a state is the optimizer step: it waits for the copy there
            self._hook = optimizer.register_step_pre_hook(lambda *_: self.wait())

    @property
    def nbytes(self) -> tuple[int, int]:
        """(bytes the copies hold on a GPU, bytes in CPU memory) for parameters, buffers and optimizer state."""
        parts = [c.nbytes for c in (self._param_copies, self._buffer_copies, self._staged, self._state)
                 if c is not None]
        return sum(p[0] for p in parts), sum(p[1] for p in parts)

    def describe(self) -> str:
        """One line for the log: where the copies live."""
        if not self.kept:
            return "off: no copy is kept; a trip gives the watch's finding without replaying the op"
        if not self.keeps_optimizer:
            return ("params: parameters and buffers only (no optimizer state): an optimizer-phase trip is reported "
                    "without its op")
        device = self._params[0].device if self._params else torch.device("cpu")
        if device.type == "cpu":
            return f"{self.mode}: on the CPU, host and device are the same memory (plain CPU copies)"
        if self._host:
            return "host: pinned CPU memory, copied asynchronously on a side stream (no device memory)"
        return f"device: copies in {device} memory"

    # -- copying -----------------------------------------------------------------------------------------------
    def _copy_out(self, saved: _Copies, sources: list[torch.Tensor]) -> None:
        """sources -> saved: CUDA -> pinned host copies on a side stream, after everything queued so far on the
        compute stream (an event marks their end); the rest in place on the compute stream."""
        for device, idx in saved.groups.items():
            whole = len(idx) == len(sources)
            dst = saved.copies if whole else [saved.copies[i] for i in idx]
            src = sources if whole else [sources[i] for i in idx]
            if device is None:  # a device -> pinned host copy here is queued too (no host sync), in stream order
                torch._foreach_copy_(dst, src, non_blocking=self._host)
                continue
            if device not in self._side:
                self._side[device] = (torch.cuda.Stream(device), torch.cuda.Event())
            stream, done = self._side[device]
            stream.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(stream):
                torch._foreach_copy_(dst, src, non_blocking=True)
            done.record(stream)
            self._pending.add(device)

    def wait(self) -> None:
        """Make the compute stream wait until the pending host copies are done: an event wait on the device, not
        a host sync. Called by the optimizer's step pre-hook (before the first write of a parameter) and by
        restore()."""
        for device in self._pending:
            torch.cuda.current_stream(device).wait_event(self._side[device][1])
        self._pending.clear()

    def _check_kept(self) -> None:
        if not self.kept:
            raise RuntimeError("no snapshot is kept (--snapshot off): there is nothing to restore")

    def _scan_optimizer(self) -> tuple[list[tuple[int, str, torch.Tensor]], dict[int, dict], set[int]]:
        """The optimizer state of this model's parameters: tensor entries [(id(param), key, value)], copies of the
        other entries {id(param): {key: value}}, and the ids that have state. It walks optimizer.state's items:
        looking a parameter up by the tensor hashes in Python, hundreds of times per step."""
        tensors, other, had = [], {}, set()
        for p, entries in (self.optimizer.state.items() if self.optimizer is not None else ()):
            pid = id(p)
            if pid not in self._param_ids:
                continue
            had.add(pid)
            for key, value in entries.items():
                if isinstance(value, torch.Tensor):
                    tensors.append((pid, key, local(value)))
                else:
                    other.setdefault(pid, {})[key] = copy.deepcopy(value)
        return tensors, other, had

    def stage(self) -> None:
        """The part of the state that the forward changes (buffers, training flags), kept aside as it is now, for a
        save() later in the step: one copy of the model serves a whole run (the Trainer's deferred save, below)."""
        if not self.kept:
            return
        if self._buffers:
            if self._staged is None:
                self._staged = _Copies([b.detach() for b in self._buffers], self._host, side=False)
            with torch.no_grad():
                torch._foreach_copy_(self._staged.copies, self._buffers, non_blocking=self._host)
        self._staged_training = [m.training for m in self._modules]

    def save(self, live_buffers: bool = False) -> None:
        """Copy the state. After stage(), the buffers and training flags are the staged ones (unless
        `live_buffers`: a re-run has just rebuilt them): the parameters and optimizer state are the same at any
        point between the start of a step and its optimizer step, so the save can wait until the previous update
        is known to be finite, and one snapshot suffices."""
        if not self.kept:
            return
        staged, self._staged_training = self._staged_training, None
        staged = None if live_buffers else staged
        with torch.no_grad():
            if self._buffers and staged is not None:  # the staged copies become the saved ones (no copy)
                self._buffer_copies, self._staged = self._staged, self._buffer_copies
            elif self._buffers:
                torch._foreach_copy_(self._buffer_copies.copies, self._buffers, non_blocking=self._host)
            self._copy_out(self._param_copies, self._param_data)  # (under no_grad: no detach() per tensor)
            state, other, had = self._scan_optimizer()
            state = state if self.keeps_optimizer else []
            keys = [(pid, k) for pid, k, _ in state]
            if keys != self._state_keys:  # first step with state (or a new param group): allocate once
                self._state_keys = keys
                self._state = _Copies([v.detach() for _, _, v in state], self._host)
            if state:
                self._copy_out(self._state, [v for _, _, v in state])
        self._training = staged if staged is not None else [m.training for m in self._modules]
        self._other_state = {
            "optimizer_nontensor": other,
            "had_state": had,
            "scaler": _scaler_state(self.scaler),
            **schedule_state(self.optimizer, self.scheduler),  # "groups", "scheduler"
        }

    def restore(self) -> None:
        self._check_kept()
        self.wait()
        for m, training in zip(self._modules, self._training):
            m.training = training  # the flag alone: a module's train() override is not re-run mid-step
        with torch.no_grad():
            # host -> device from pinned memory, queued on the compute stream: ordered before what follows
            for live, saved in ((self._param_data, self._param_copies), (self._buffers, self._buffer_copies)):
                if live:
                    torch._foreach_copy_([t.data for t in live], saved.copies, non_blocking=self._host)
        for p in self._params:
            p.grad = None
        if self.optimizer is not None and self.keeps_optimizer:  # (params: unchanged since the step began)
            self._restore_optimizer()
        _restore_scaler(self.scaler, self._other_state["scaler"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(self._other_state["scheduler"])

    def restore_buffers(self) -> list[torch.Tensor]:
        """Only the buffers as saved, for a forward-only replay in the middle of a step (the parameters, optimizer
        and training flags have not changed since it began) -> copies of the live buffers, to put back with
        put_back_buffers() afterwards."""
        self._check_kept()
        self.wait()
        live = [b.detach().clone() for b in self._buffers]
        if self._buffers:
            with torch.no_grad():
                torch._foreach_copy_([b.data for b in self._buffers], self._buffer_copies.copies,
                                     non_blocking=self._host)
        return live

    def put_back_buffers(self, live: list[torch.Tensor]) -> None:
        if self._buffers:
            with torch.no_grad():
                torch._foreach_copy_([b.data for b in self._buffers], live)

    def _restore_optimizer(self) -> None:
        with torch.no_grad():
            for p in self._params:
                if id(p) not in self._other_state["had_state"]:
                    self.optimizer.state.pop(p, None)
            by_id = {id(p): p for p in self._params}
            for (pid, key), saved in zip(self._state_keys, self._state.copies if self._state else []):
                if pid in self._other_state["had_state"]:
                    local(self.optimizer.state[by_id[pid]][key]).copy_(saved, non_blocking=self._host)
            for p in self._params:
                for k, v in self._other_state["optimizer_nontensor"].get(id(p), {}).items():
                    self.optimizer.state[p][k] = copy.deepcopy(v)
        put_groups(self.optimizer, self._other_state["groups"])

    def state_dicts(self) -> dict:
        """Model, optimizer, scaler and scheduler state and the training flags as of save(), on the CPU (for a
        repro bundle). It restores the snapshot to read them: call it when the live state is no longer needed."""
        self._check_kept()
        self.restore()

        def cpu(obj):
            if isinstance(obj, torch.Tensor):
                return obj.detach().cpu().clone()
            if isinstance(obj, dict):
                return {k: cpu(v) for k, v in obj.items()}
            if isinstance(obj, (list, tuple)):
                return type(obj)(cpu(v) for v in obj)
            return copy.deepcopy(obj)

        return {"model": cpu(self.model.state_dict()),
                "optimizer": cpu(self.optimizer.state_dict()) if self.optimizer is not None else None,
                "scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "scheduler": self._other_state["scheduler"],
                "training": {name: m.training for name, m in self.model.named_modules()}}

    def load_state_dicts(self, states: dict) -> None:
        """The inverse of state_dicts(): load them into the live model, optimizer, scaler and scheduler (a repro
        bundle's, rebuilt on another machine), then save() them as this snapshot."""
        self.model.load_state_dict(states["model"])
        if self.optimizer is not None and states.get("optimizer") is not None:
            self.optimizer.load_state_dict(states["optimizer"])
        if self.scaler is not None and states.get("scaler"):
            self.scaler.load_state_dict(states["scaler"])
        if self.scheduler is not None and states.get("scheduler"):
            self.scheduler.load_state_dict(states["scheduler"])
        for name, m in self.model.named_modules():
            m.training = states.get("training", {}).get(name, m.training)
        self.save()
