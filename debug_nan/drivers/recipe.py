"""What the run trains with, taken from the task: the debug run is the user's run.

The optimizer (the task's `optimizer(params)`, else AdamW at --lr / --weight-decay), the LR schedule (the task's
`scheduler(optimizer)`) and gradient clipping (the task's `max_grad_norm`). An explicit --warmup-steps or
--max-grad-norm (or its config key) replaces the task's own; nothing else is ever added. The built-in AAM
pipeline asks for its warmup and clipping itself (aam/task.py), like any task.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from debug_nan.errors import InputError, describe_exception
from debug_nan.settings.training import TrainSettings


@dataclass
class Recipe:
    optimizer: torch.optim.Optimizer
    scheduler: object | None  # stepped once per optimizer step
    max_grad_norm: float | None  # None: no clipping
    origin: dict[str, str] = field(default_factory=dict)  # optimizer / scheduler / max_grad_norm -> who asked

    def lr(self) -> float:
        group = self.optimizer.param_groups[0]
        return group.get("initial_lr", group["lr"])  # a scheduler keeps the base lr there

    def describe(self) -> dict:
        """For the JSON report: what the run really trained with."""
        return {"optimizer": type(self.optimizer).__name__, "lr": self.lr(),
                "scheduler": type(self.scheduler).__name__ if self.scheduler is not None else None,
                "max_grad_norm": self.max_grad_norm, "from": dict(self.origin)}

    def line(self) -> str:
        """For the run header: optimizer, lr, clipping and schedule, each with where it came from."""
        def said(key: str) -> str:
            return f" ({self.origin[key]})" if key in self.origin else ""

        clip = f"clip {self.max_grad_norm:g}{said('max_grad_norm')}" if self.max_grad_norm else "no clipping"
        schedule = (f"schedule {type(self.scheduler).__name__}{said('scheduler')}" if self.scheduler is not None
                    else "constant lr")
        return (f"optimizer {type(self.optimizer).__name__} (lr {self.lr():g}){said('optimizer')} | {clip} | "
                f"{schedule}")


def linear_warmup(optimizer: torch.optim.Optimizer, steps: int) -> torch.optim.lr_scheduler.LambdaLR:
    """lr rises linearly to its base value over `steps` optimizer steps, then stays (steps <= 1: constant)."""
    warmup = max(1, steps)
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: min(1.0, (i + 1) / warmup))


def build_recipe(task, settings: TrainSettings, params: list[torch.nn.Parameter], log) -> Recipe:
    """The task's optimizer, schedule and clipping, each replaced only by the option that asks for it."""
    origin = {}
    own = "the task's" if task.spec else "the built-in pipeline's"
    if task.optimizer is None:
        optimizer = torch.optim.AdamW(params, lr=settings.lr, weight_decay=settings.weight_decay)
        origin["optimizer"] = "--lr, --weight-decay"
    else:
        optimizer = _call(task, "optimizer(params)", task.optimizer, params)
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise InputError(f"--task {task.spec}: optimizer(params) must return a torch.optim.Optimizer, got "
                             f"{type(optimizer).__name__}.")
        origin["optimizer"] = own
    scheduler = None
    if settings.warmup_steps is not None:
        if task.scheduler is not None:
            log(f"NOTICE: --warmup-steps {settings.warmup_steps} replaces the task's own scheduler.")
        scheduler = linear_warmup(optimizer, settings.warmup_steps)
        origin["scheduler"] = f"--warmup-steps {settings.warmup_steps}"
    elif task.scheduler is not None:
        scheduler = _checked_scheduler(task, _call(task, "scheduler(optimizer)", task.scheduler, optimizer))
        origin["scheduler"] = own
    clip = task.max_grad_norm
    if clip:
        origin["max_grad_norm"] = own
    if settings.max_grad_norm is not None:
        clip = settings.max_grad_norm
        origin["max_grad_norm"] = "--max-grad-norm"
    return Recipe(optimizer, scheduler, clip or None, origin)


def _call(task, what: str, fn, arg):
    try:
        return fn(arg)
    except Exception as exc:  # noqa: BLE001 - the task's own code: any failure is its, in one line
        raise InputError(f"--task {task.spec or task.name}: {what} raised {describe_exception(exc)}.") from None


def _checked_scheduler(task, scheduler):
    if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau):
        raise InputError(f"--task {task.spec}: scheduler(optimizer) returned a ReduceLROnPlateau, which steps on a "
                         f"validation metric; debug-nan steps the scheduler once per optimizer step without "
                         f"arguments. Leave it out of the task (the lr then stays at its base value).")
    missing = [m for m in ("step", "state_dict", "load_state_dict") if not callable(getattr(scheduler, m, None))]
    if missing:
        raise InputError(f"--task {task.spec}: scheduler(optimizer) must return an LR scheduler (with "
                         f"{', '.join(missing)}), got {type(scheduler).__name__}.")
    return scheduler


def enter_training_mode(model: torch.nn.Module) -> list[str]:
    """model.train() once, as a training loop does before its first step. Submodules the task left in eval mode
    while the model itself was in training mode (a frozen BatchNorm or encoder) stay in eval mode, and so does
    whatever the model's own train() keeps frozen. Returns the outermost paths in eval mode."""
    frozen = [m for m in model.modules() if not m.training] if model.training else []
    model.train()
    for m in frozen:
        m.training = False  # the flag alone, module by module, as the task had it
    paths = [name for name, m in model.named_modules() if not m.training]
    return [p for p in paths if not any(p.startswith(q + ".") for q in paths if q != p)]
