"""In which steps the watch measures module outputs (min / max of each: the history's max |activation|, the notes
on deliberate -inf masks, the warning on huge activations).

Module outputs never trip: harm is a non-finite loss, gradient, parameter, optimizer state or buffer, checked in
every micro-batch of every step, and a trip's op is named by the replay's tracer, which sees every op. So the
outputs may be measured on a stride where measuring them is a noticeable share of a step: on the CPU, one
reduction per hooked module costs ~3-4% of a deep narrow model's step (221 outputs of 32K-128K values each).

  * every step for the first WARM_STEPS steps (a short debugging run sees everything);
  * then, on the CPU, as often as costs at most OUTPUT_SHARE of a step, measured: the time spent in the hooks plus
    a fixed cost per hooked call (a registered hook takes its module off torch's fast call path), against the
    step's wall time (from its start to its optimizer step), summed over the measured steps; a power of two;
  * on CUDA every step (the reductions are queued on the device, the host only launches them), and with
    `every` given, every `every` steps (1: every step).
"""

from __future__ import annotations

import math
import time

WARM_STEPS = 16  # every step's module outputs are measured up to this step
OUTPUT_SHARE = 0.005  # the share of a step the measurement may cost, amortised over the steps between two
MAX_OUTPUTS_EVERY = 16
HOOK_CALL_SECONDS = 4e-6  # what a registered forward hook adds to its module's call, besides the hook's own work
# (measured on the 2-core CPU: 0.9 ms over the 221 hooked calls of a deep narrow model's forward)


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
        self.begun = 0  # steps begun in this run (not their numbers: a resumed run starts at any step)
        self._measuring = False  # the step under way measures its outputs
        self._began: float | None = None
        self._spent = 0.0  # seconds in the hooks, over the measured steps whose time is known
        self._stepped = 0.0  # those steps' wall time
        self._told = False  # the log said that the outputs are measured on a stride

    def begin(self) -> bool:
        """A step begins -> whether its module outputs are measured: the first WARM_STEPS steps of the run (unless
        fixed), then every `every`-th (a fixed stride counts from the run's first step; the adaptive one is a power
        of two, so that the measured steps of a fresh run are among those the history keeps per layer when it thins
        older steps, at `step % 2^k == 0`)."""
        self.begun += 1
        self._began = time.perf_counter()
        if self.fixed is not None:
            self._measuring = (self.begun - 1) % self.every == 0
        else:
            self._measuring = self.begun <= WARM_STEPS or self.begun % self.every == 0
        if not self._measuring and self.adaptive and not self._told and self._stepped > 0:
            self._told = True
            self.log(f"  [watch] measuring the module outputs takes {self._spent / self._stepped:.1%} of a step: "
                     f"from now on they are measured every {self.every} steps (they never trip; the loss, "
                     f"gradients, parameters, optimizer state and buffers are still checked in every micro-batch)")
        return self._measuring

    def stepped(self, hook_seconds: float, hook_calls: int) -> None:
        """The step took its optimizer step; `hook_seconds`, `hook_calls`: the time in the watch's forward hooks
        and their calls (Watch.hook_seconds / hook_calls)."""
        if not (self.adaptive and self._measuring and self._began is not None):
            return
        self._spent += hook_seconds + HOOK_CALL_SECONDS * hook_calls
        self._stepped += time.perf_counter() - self._began
        self._began = None
        needed = max(1, math.ceil(self._spent / self._stepped / OUTPUT_SHARE))
        self.every = min(MAX_OUTPUTS_EVERY, 1 << (needed - 1).bit_length())  # the power of two at or above


__all__ = ["HOOK_CALL_SECONDS", "MAX_OUTPUTS_EVERY", "OUTPUT_SHARE", "OutputSchedule", "WARM_STEPS"]
