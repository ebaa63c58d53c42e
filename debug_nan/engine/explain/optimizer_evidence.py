"""The evidence for an origin inside the optimizer step: the hyperparameters the step actually used.

They live in `optimizer.param_groups` (a scheduler writes the lr there every step), not in `optimizer.defaults`
(the constructor's arguments): a schedule that returns NaN past its end leaves defaults at lr 0.01 and the
group at lr nan. The values are read before the replayed step (the replay's own schedule step changes them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SHOWN = ("lr", "eps", "betas", "momentum", "weight_decay")


@dataclass
class StepHyperparameters:
    groups: list[dict]  # per param group: the SHOWN entries, as the step used them
    param_group: dict[int, int]  # id(parameter) -> its group's index
    scheduler: str | None  # the schedule's class name
    scheduler_step: int | None  # its last_epoch: how many times it had been stepped


def _number(value) -> float | None:
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        return float(value)
    return float(value) if isinstance(value, (int, float)) else None


def read_hyperparameters(optimizer, scheduler=None) -> StepHyperparameters:
    groups = [{k: g[k] for k in SHOWN if k in g} for g in optimizer.param_groups]
    owner = {id(p): i for i, g in enumerate(optimizer.param_groups) for p in g["params"]}
    return StepHyperparameters(groups, owner, type(scheduler).__name__ if scheduler is not None else None,
                               getattr(scheduler, "last_epoch", None))


def _nonfinite_lr(hyper: StepHyperparameters) -> list[tuple[int, float]]:
    out = []
    for i, g in enumerate(hyper.groups):
        lr = _number(g.get("lr"))
        if lr is not None and not math.isfinite(lr):
            out.append((i, lr))
    return out


def _located(optimizer, index: int) -> tuple[object, str, int]:
    """(the optimizer that holds param group `index`, the name to write it with, its index there). Where a run has
    several optimizers (`debug-nan run`'s view of them, with `locate`), the script's own optimizer and its name."""
    locate = getattr(optimizer, "locate", None)
    return locate(index) if locate is not None else (optimizer, "optimizer", index)


def optimizer_explanation(optimizer, hyper: StepHyperparameters | None, param, what: str,
                          evidence: str) -> tuple[str, list[str] | None]:
    """(explanation, suggestions that replace the cause's, or None) for an origin in `optimizer`'s step that made
    `what` (a parameter or state, by name) non-finite; `param` is that parameter (None when unknown)."""
    if optimizer is None:  # a loop that updates the weights by hand
        return (f"The training loop's own update (no torch.optim optimizer) made {what} non-finite although every "
                f"gradient going in was finite: {evidence}. The source line is the update's.",
                ["Check the step size and every factor of the hand-written update at that line (a learning rate or "
                 "a schedule gone non-finite, a division by a norm or a count that is 0), or use a torch.optim "
                 "optimizer."])
    if hyper is None:  # no record of the step's values: the groups as they are now
        hyper = read_hyperparameters(optimizer)
    group = hyper.param_group.get(id(param), 0) if param is not None else 0
    settings = hyper.groups[group] if group < len(hyper.groups) else {}
    bad = _nonfinite_lr(hyper)
    if not bad:
        holder, name, local = _located(optimizer, group)
        return (f"The {type(holder).__name__} step made {what} non-finite although every gradient going in was "
                f"finite: {evidence} (this parameter group's settings in {name}.param_groups[{local}]: {settings}).",
                None)
    index, lr = bad[0]
    holder, name, index = _located(optimizer, index)
    kind = type(holder).__name__
    by = (f"the schedule {hyper.scheduler} set it after {hyper.scheduler_step} of its steps"
          if hyper.scheduler is not None else "no scheduler is attached: something wrote it into the group")
    explanation = (f"The learning rate is {lr} in {name}.param_groups[{index}] ({name}.defaults still says "
                   f"{holder.defaults.get('lr')}): {by}, and the {kind} step multiplied every update by it, so "
                   f"{what} became non-finite although every gradient going in was finite. The op: {evidence}")
    if hyper.scheduler is None:  # the loop sets the lr itself: its own formula is the suspect
        suggestions = [
            f"Find the code that writes {name}.param_groups[{index}]['lr'] (no torch.optim.lr_scheduler is "
            f"attached, so the training loop sets it itself): print the value it computes for the last steps; it "
            f"must stay finite for every step the run takes.",
            "A formula such as (1 - step / max_steps) ** power past max_steps raises a negative number to a "
            "fractional power (NaN), and a division by a step count or a warmup length of 0 gives inf: clamp the "
            "progress to [0, 1] and guard the denominators.",
        ]
        return explanation, suggestions
    suggestions = [
        f"Fix the schedule ({hyper.scheduler}): it must stay finite for every step the run takes. A poly schedule "
        f"(1 - step / max_steps) ** power past max_steps raises a negative number to a fractional power (NaN): "
        f"clamp the progress to [0, 1], or set max_steps to the real number of steps.",
        "Print scheduler.get_last_lr() for the last steps to see where it left the finite range.",
    ]
    return explanation, suggestions
