"""The state just before an optimizer step's first micro-batch, so a failing micro-batch can be replayed.

Parameters, buffers and optimizer state are copied on their device into buffers allocated once
(`_foreach_copy_`), each module's `training` flag is kept (a submodule the user froze in eval mode replays in
eval mode), the scaler/scheduler state is kept as a dict, and the RNG state is captured before every micro-batch.
"""

from __future__ import annotations

import copy
import random
from collections import defaultdict

import numpy as np
import torch


def capture_rng(device: torch.device) -> dict:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng(state: dict, device: torch.device) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


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


class Snapshot:
    """save() before each optimizer step; restore() puts model (parameters, buffers, training flags), optimizer,
    scaler and scheduler back. The optimizer may be None (the API's Monitor without one)."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, scaler=None,
                 scheduler=None):
        self.model, self.optimizer, self.scaler, self.scheduler = model, optimizer, scaler, scheduler
        self._params = [p for p in model.parameters()]
        self._param_copies = [p.detach().clone() for p in self._params]
        # buffers too: BatchNorm running statistics (and any custom buffer) change in every forward
        self._buffers = [b for b in model.buffers()]
        self._buffer_copies = [b.detach().clone() for b in self._buffers]
        self._modules = [m for m in model.modules()]
        self._training: list[bool] = [m.training for m in self._modules]
        self._state_keys: list[tuple[torch.Tensor, str]] = []
        self._state_copies: list[torch.Tensor] = []
        self._other_state: dict = {}

    def _state_tensors(self) -> list[tuple[torch.Tensor, str, torch.Tensor]]:
        out = []
        if self.optimizer is None:
            return out
        for p in self._params:
            for key, value in self.optimizer.state.get(p, {}).items():
                if isinstance(value, torch.Tensor):
                    out.append((p, key, value))
        return out

    def save(self) -> None:
        with torch.no_grad():
            torch._foreach_copy_(self._param_copies, [p.detach() for p in self._params])
            for saved, b in zip(self._buffer_copies, self._buffers):
                saved.copy_(b)
            state = self._state_tensors()
            keys = [(id(p), k) for p, k, _ in state]
            if keys != self._state_keys:  # first step with state (or a new param group): allocate once
                self._state_keys = keys
                self._state_copies = [v.detach().clone() for _, _, v in state]
            elif state:
                torch._foreach_copy_(self._state_copies, [v.detach() for _, _, v in state])
        self._training = [m.training for m in self._modules]
        opt_state = self.optimizer.state if self.optimizer is not None else {}
        self._other_state = {
            "optimizer_nontensor": {id(p): {k: copy.deepcopy(v) for k, v in opt_state.get(p, {}).items()
                                            if not isinstance(v, torch.Tensor)} for p in self._params},
            "had_state": {id(p) for p in self._params if p in opt_state},
            # lr and the other hyperparameters live in the param groups (the scheduler writes them there)
            "groups": [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"}
                       for g in (self.optimizer.param_groups if self.optimizer is not None else [])],
            "scaler": _scaler_state(self.scaler),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
        }

    def restore(self) -> None:
        for m, training in zip(self._modules, self._training):
            m.training = training  # the flag alone: a module's train() override is not re-run mid-step
        with torch.no_grad():
            torch._foreach_copy_([p.data for p in self._params], self._param_copies)
            for b, saved in zip(self._buffers, self._buffer_copies):
                b.copy_(saved)
        for p in self._params:
            p.grad = None
        if self.optimizer is not None:
            self._restore_optimizer()
        _restore_scaler(self.scaler, self._other_state["scaler"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(self._other_state["scheduler"])

    def _restore_optimizer(self) -> None:
        with torch.no_grad():
            for p in self._params:
                if id(p) not in self._other_state["had_state"]:
                    self.optimizer.state.pop(p, None)
            by_id = {id(p): p for p in self._params}
            for (pid, key), saved in zip(self._state_keys, self._state_copies):
                if pid in self._other_state["had_state"]:
                    self.optimizer.state[by_id[pid]][key].copy_(saved)
            for p in self._params:
                for k, v in self._other_state["optimizer_nontensor"].get(id(p), {}).items():
                    self.optimizer.state[p][k] = copy.deepcopy(v)
        for group, saved in zip(self.optimizer.param_groups, self._other_state["groups"]):
            group.update(copy.deepcopy(saved))

    def state_dicts(self) -> dict:
        """Model, optimizer, scaler and scheduler state and the training flags as of save(), on the CPU (for a
        repro bundle). It restores the snapshot to read them: call it when the live state is no longer needed."""
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
