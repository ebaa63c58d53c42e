"""TrainSettings: how the runner trains (the config's [train] table): the task, device, steps, the default
optimizer and what replaces the task's recipe, precision, the checkpoint to start from, the eval pass, FSDP. For a
framework callback, what it read from the framework (drivers/framework_outputs.py run_settings)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from debug_nan.errors import InputError
from debug_nan.settings.tables import check_choices, setting


@dataclass
class TrainSettings:
    TABLE: ClassVar[str] = "train"
    TITLE: ClassVar[str] = "Training options"

    task: str | None = None
    device: str = "auto"
    max_steps: int = 10
    gradient_accumulation_steps: int = 1
    lr: float = 1e-4  # the default optimizer's (AdamW): a task's own optimizer sets its own
    weight_decay: float = 0.01
    warmup_steps: int | None = None  # None: the task's own schedule (the built-in pipeline: warmup 2)
    max_grad_norm: float | None = None  # None: the task's own clipping (the built-in pipeline: 1.0); 0: none
    precision: str = setting("fp32", choices=("fp32", "bf16", "fp16"))
    seed: int = 42
    checkpoint: str | None = None  # start from the user's checkpoint (drivers/trainer/checkpoint.py)
    checkpoint_non_strict: bool = False
    checkpoint_unsafe_load: bool = False
    skip_batches: int = 0  # micro-batches to fast-forward past (without training) before the first step
    eval_every: int | None = None  # an eval pass every N optimizer steps, and one at the end; None: none
    eval_batches: int | None = None  # held-out batches per eval pass (None: all of them)
    fsdp: bool = False  # under torchrun: shard the model with FSDP2 (drivers/trainer/sharding.py) instead of DDP

    def validate(self) -> None:
        """Range checks that do not need the data; each message names the option."""
        for name in ("max_steps", "gradient_accumulation_steps"):
            value = getattr(self, name)
            if value is None or value <= 0:
                raise InputError(f"--{name.replace('_', '-')} must be a positive integer, got {value}.")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise InputError(f"--lr must be a positive finite number, got {self.lr}.")
        for name in ("weight_decay", "max_grad_norm"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise InputError(f"--{name.replace('_', '-')} must be a finite number >= 0, got {value}.")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise InputError(f"--warmup-steps must be >= 0, got {self.warmup_steps}.")
        if not 0 <= self.seed < 2**63:
            raise InputError(f"--seed must be in 0 .. 2^63 - 1, got {self.seed}.")
        if self.skip_batches < 0:
            raise InputError(f"--skip-batches must be >= 0, got {self.skip_batches}.")
        for name in ("eval_every", "eval_batches"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise InputError(f"--{name.replace('_', '-')} must be a positive integer, got {value}.")
        if self.eval_every is None and self.eval_batches is not None:
            raise InputError("--eval-batches sets up the eval pass, which runs only with --eval-every N; add it.")
        check_choices(self)
