"""Everything drivers/run/hooks.py's `Hooks` (and its optimizers.py part) know of the script's run, in one object:
where the script is in a micro-batch and how it updates its weights (named states, `Micro` and `Updates`), the step
count, what is watched, and what the optimizer steps and the GradScaler did since the last backward. Nothing else
holds state: the hooks read and write these fields, and the run (app/) reads them at the command's end.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from enum import Enum

import torch
from torch import nn


class Micro(Enum):
    """Where the script is in a micro-batch."""

    CLOSED = "closed"  # none open: the last one's backward ended (or none began)
    FORWARD = "forward"  # the model's first training forward opened it: the script's code runs to its backward
    BACKWARD = "backward"  # inside its backward() (a forward there is the backward's recomputation, no new one)


class Updates(Enum):
    """How the script updates its weights, as far as the hooks know."""

    UNKNOWN = "unknown"  # no backward yet without an optimizer that has a model: not looked for
    UNOWNED = "unowned"  # a backward came first, and no module owns the parameters it reached
    BY_HAND = "by hand"  # ... and a module did: a loop that updates the weights by hand (no optimizer)


@dataclass
class HookState:
    # the count: the step under way (1-based: optimizer steps taken + 1) and its micro-batches so far
    step: int = 1
    micro: int = 0
    phase: Micro = Micro.CLOSED
    paused: bool = False  # a replay runs: its forwards, backwards and steps are not the run's
    in_step: bool = False  # inside an optimizer's own math (the recorder is off)
    # what is watched (drivers/run/optimizers.py)
    root: nn.Module | None = None  # the model (several optimizers: the Models holding theirs)
    optimizer: torch.optim.Optimizer | None = None  # the one that owns the root's parameters (or an Optimizers)
    other_optimizers: list = field(default_factory=list)  # weak references to optimizers created beside it
    retired: weakref.WeakSet = field(default_factory=weakref.WeakSet)  # optimizers a newer one replaced
    models: nn.Module | None = None  # several optimizers: the one module that holds their parameters
    paths: dict = field(default_factory=dict)  # ... and where each of its modules sits in it (id -> dotted path)
    schedulers: list = field(default_factory=list)  # weak references to the LR schedulers the script created
    updates: Updates = Updates.UNKNOWN  # (a torch.optim optimizer's model, once one has it: `root`, `optimizer`)
    # what happened since the last backward or step
    stepped_since_update: bool = False  # the watched optimizer stepped since the last GradScaler.update()
    stepped_this_step: bool = False  # ... since the step's first micro-batch
    backward_since_open: bool = False  # a backward ended since the last micro-batch opened
    step_pending: bool = False  # several optimizers: a step was taken and another may join it before a forward
    pending_update: object | None = None  # ... and the tape of that step's update
    # the GradScaler: its last scale() output (weakly) and input, and the scaler itself
    scaled: weakref.ref | None = None
    unscaled: torch.Tensor | None = None
    scaler: object | None = None

    @property
    def manual(self) -> bool:
        """A loop that updates the weights by hand."""
        return self.updates is Updates.BY_HAND

    @property
    def open(self) -> bool:
        """A micro-batch's forward has begun and its backward not yet ended."""
        return self.phase is not Micro.CLOSED
