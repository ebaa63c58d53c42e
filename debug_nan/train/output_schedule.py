"""In which steps the watch measures module outputs (min / max of each: the history's max |activation|, the notes
on deliberate -inf masks, the warning on huge activations).

Module outputs never trip: harm is a non-finite loss, gradient, parameter, optimizer state or buffer, checked in
every micro-batch of every step, and a trip's op is named by the replay's tracer, which sees every op. So the
outputs may be measured on a stride where measuring them is a noticeable share of a step: on the CPU, one
reduction per hooked module costs ~3-4% of a deep narrow model's step (221 outputs of 32K-128K values each).

  * every step for the first WARM_STEPS steps (a short debugging run sees everything);
  * then, on the CPU, as often as costs at most OUTPUT_SHARE of a step, measured: the time spent in the hooks
    against the step's wall time (from its start to its optimizer step), summed over the measured steps;
  * on CUDA every step (the reductions are queued on the device, the host only launches them), and with
    `every` given, every `every` steps (1: every step).
"""

from __future__ import annotations

import math
import time

WARM_STEPS = 16  # every step's module outputs are measured up to this step
OUTPUT_SHARE = 0.005  # the share of a step the measurement may cost, amortised over the steps between two
MAX_OUTPUTS_EVERY = 16


class OutputSchedule:
    def __init__(self, every: int | None, adaptive: bool, log=lambda line="", colour=None: None):
        """`every`: a fixed stride (None or 0: chosen here); `adaptive`: choose it from measured costs (the CPU)."""
        if every is not None and every < 0:
            raise ValueError(f"outputs_every={every}: measure the module outputs every N >= 1 steps, or 0 / None "
                             f"to have it chosen from what measuring them costs")
        self.fixed = every or None
        self.every = every or 1
        self.adaptive = self.fixed is None and adaptive
        self.log = log
        self.last_measured: int | None = None
        self._measuring = False  # the step under way measures its outputs
        self._began: float | None = None
        self._spent = 0.0  # seconds in the hooks, over the measured steps whose time is known
        self._stepped = 0.0  # those steps' wall time
        self._told = False  # the log said that the outputs are measured on a stride

    def begin(self, step: int) -> bool:
        """A step begins -> whether its module outputs are measured."""
        self._began = time.perf_counter()
        due = self.last_measured is None or step - self.last_measured >= self.every
        self._measuring = step <= WARM_STEPS and self.fixed is None or due
        if self._measuring:
            self.last_measured = step
        elif self.adaptive and not self._told:
            self._told = True
            self.log(f"  [watch] measuring the module outputs takes {self._spent / self._stepped:.1%} of a step: "
                     f"from step {step} they are measured every {self.every} steps (they never trip; the loss, "
                     f"gradients, parameters, optimizer state and buffers are still checked in every micro-batch)")
        return self._measuring

    def stepped(self, hook_seconds: float) -> None:
        """The step took its optimizer step; `hook_seconds`: the time the watch spent measuring its outputs."""
        if not (self.adaptive and self._measuring and self._began is not None):
            return
        self._spent += hook_seconds
        self._stepped += time.perf_counter() - self._began
        self._began = None
        share = self._spent / self._stepped
        self.every = min(MAX_OUTPUTS_EVERY, max(1, math.ceil(share / OUTPUT_SHARE)))


__all__ = ["MAX_OUTPUTS_EVERY", "OUTPUT_SHARE", "OutputSchedule", "WARM_STEPS"]
