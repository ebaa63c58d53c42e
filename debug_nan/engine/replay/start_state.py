"""A value that was non-finite before the run's first step: nothing in this run wrote it.

The replay of the run's FIRST step restores the state the run began with: the model as the task built it or,
with --checkpoint, as the file held it. A parameter, buffer or optimizer state met non-finite there (not a
deliberate mask) was loaded or initialised so: the finding names the checkpoint (or the task's initialisation),
not "an earlier step" nor an optimizer step to be tamed by a lower learning rate.
"""

from __future__ import annotations

import torch

from debug_nan.engine.explain.evidence import module_type, sample_ids, stats_dict
from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.stats import tensor_stats
from debug_nan.engine.trace.events import OpEvent
from debug_nan.engine.vocabulary import Cause, Phase

CHECKPOINT_SUGGESTIONS = [
    "The checkpoint file itself holds the NaN/Inf: resume from an earlier checkpoint, or repair the named tensor "
    "(e.g. reset that optimizer state to zeros) before resuming.",
    "The run that saved it had already gone non-finite: debug that run from an earlier checkpoint (--checkpoint "
    "OLDER.pt) to name the op that wrote it, and check the saving code saves the state it means to.",
]
INIT_SUGGESTIONS = [
    "The model was non-finite before its first step: check its initialisation (a custom init dividing by a zero "
    "fan-in, a tensor created with torch.empty and never filled) or the file its weights were loaded from.",
]


def state_name(label: str) -> str:
    """'parameter `0.weight`' -> '0.weight'; '0.weight (optimizer exp_avg)' stays as it is."""
    for prefix in ("parameter `", "buffer `"):
        if label.startswith(prefix) and label.endswith("`"):
            return label[len(prefix):-1]
    return label


def is_start_state(event: OpEvent) -> bool:
    """A pre-existing non-finite parameter, buffer or optimizer state that is no deliberate mask."""
    return event.label is not None and event.phase != Phase.DATA and not event.deliberate and (
        event.phase == Phase.OPTIMIZER or event.label.startswith(("parameter `", "buffer `")))


def start_state_finding(step: int, micro: int, event: OpEvent, raw, watch: str | None, model: torch.nn.Module,
                        checkpoint: str | None) -> Finding:
    """The finding for `event` (is_start_state) met in the replay of the run's first step, `step`."""
    name = state_name(event.label)
    t = event.outputs[0][1] if event.outputs else None
    counts = ""
    if isinstance(t, torch.Tensor):
        s = tensor_stats(t)
        counts = f" {list(t.shape)} holds {s.nan} NaN, {s.posinf} +Inf and {s.neginf} -Inf of {s.numel} values"
    what = f"`{name}`{counts}"
    if checkpoint:
        explanation = (f"{what} was already non-finite in the checkpoint: it was loaded from --checkpoint "
                       f"{checkpoint} before step {step}, the first step of this run, so nothing in this run wrote "
                       f"it; the first step used it and the harm followed.")
        suggestions = list(CHECKPOINT_SUGGESTIONS)
    else:
        explanation = (f"{what} was non-finite before step {step}, the first step of this run: the model (or its "
                       f"optimizer state) came in so, as built or loaded before training; no step of this run "
                       f"wrote it.")
        suggestions = list(INIT_SUGGESTIONS)
    if event.source:
        explanation += f" First used at {event.source}."
    param = name.split(" (optimizer")[0]
    module = param.rsplit(".", 1)[0] if "." in param else ""
    return Finding(step=step, micro_step=micro, phase=event.phase, module=module,
                   module_type=module_type(model, module), op=None, kind=event.kind, cause=Cause.NONFINITE_PARAMETER,
                   explanation=explanation, source=event.source, suggestions=suggestions,
                   source_line=event.source_line, sample_ids=sample_ids(raw), outputs=stats_dict(event.outputs),
                   watch=watch)
