"""A micro-batch traced as it runs, for the one case no replay can answer (`debug-nan run --trace-at STEP:MICRO`).

The in-place replay re-runs a micro-batch from the run's own state; where the driver cannot (drivers/run/tape.py
says why: a tensor with a graph from outside the recorded calls, an outside tensor changed in place since), the
user may run the command again with the micro-batch named, and the driver traces it live: the op-level tracer is
entered at its first forward and left after its backward, and the pinpointer explains that trace instead of a
replay (Pinpointer.pinpoint). It is a re-execution: the script's files are written again up to that step, and the
NaN must come back (a seeded run), which the log says when it does not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from debug_nan.engine.stats import flat_tensors, nonfinite_names
from debug_nan.engine.trace.tracer import Tracer


@dataclass
class LiveTrace:
    step: int
    micro: int  # 1-based
    tracer: Tracer
    loss: torch.Tensor | None = None  # what the micro-batch's backward() took
    grads: list = field(default_factory=list)  # (parameter name, its gradient) after the backward
    open: bool = True

    @classmethod
    def start(cls, model: nn.Module, batch, step: int, micro: int, poisoned: frozenset = frozenset()) -> LiveTrace:
        """Enter the tracer now (the micro-batch's first forward is about to run), its batch marked as data."""
        tracer = Tracer(model, poisoned=poisoned)
        tracer.__enter__()
        for path, t in flat_tensors(batch):
            tracer.mark(t, path, "data")
        return cls(step, micro, tracer)

    def stop(self, model: nn.Module) -> None:
        """Leave the tracer (after the backward, or where the micro-batch ended): the gradients as they are."""
        if self.open:
            self.tracer.__exit__(None, None, None)
            self.open = False
            self.grads = [(n, p.grad) for n, p in model.named_parameters() if p.grad is not None]

    def covers(self, step: int, micro: int, optimizer: bool) -> bool:
        """Is this the micro-batch a trip points at? (An update's trip is replayed as usual.)"""
        return not optimizer and (step, micro) == (self.step, self.micro)

    def origin(self, facts, error: BaseException | None = None):
        """The earliest origin in the harmed value's lineage: the loss where it is non-finite, else the gradients
        (where the micro-batch raised before them: the earliest birth); what the trace saw goes into `facts`
        (engine/explain/explain.py's ReplayFacts)."""
        if self.loss is not None:
            facts.loss_value = float(self.loss.detach()) if self.loss.numel() == 1 else None
            event = self.tracer.origin_of([self.loss])
            facts.loss_harmed, facts.consequence = event is not None, self.tracer.consequence
            if event is not None:
                return event
        facts.grads_nonfinite = nonfinite_names(self.grads)
        facts.nonfinite_outputs = list(self.tracer.nonfinite_outputs)
        event = self.tracer.origin_of([g for _, g in self.grads])
        facts.consequence = self.tracer.consequence
        return event if event is not None or error is None else self.tracer.first
