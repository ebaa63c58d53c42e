"""When the step session copies the state, and how it gets the copy of a given step's start back.

The snapshot (engine/replay/snapshot.py) holds ONE copy: the parameters, buffers and optimizer state as some step M
began. Copying them before every step costs as much memory traffic as an Adam step: on the CPU, 7-8% of a
GPT-2-like step. So the copy is taken only every `every` steps, chosen so that it costs at most SNAPSHOT_SHARE of a
step (measured: the copy's time against the step's); `since` keeps the inputs of the steps begun after it (their
batches, RNG states, hyperparameters and the watch's reading of the state as each began).

A trip needs the state as its step began:
  * mid-step (a forward, loss or backward trip, the fp16 probe, a buffer writer, an explosion): the live
    parameters and optimizer state ARE that step's start (nothing wrote them since), and the buffers were staged as
    it began: copied now, exact, at the cost of one copy;
  * an optimizer update that made a parameter non-finite, seen at the next step's first sync: the state before
    that update is rebuilt from the copy by re-running the steps between (engine/replay/catch_up.py, checked against the
    watch's reading of the run's state at that step).
On CUDA the host copy runs on a side stream, overlapped with the step (every step); under DDP every rank copies
every step (the ranks would have to agree on re-runs); `snapshot_every` fixes the interval.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager

from debug_nan.engine.replay.catch_up import REACHED, Reached, catch_up, missed
from debug_nan.engine.replay.driver import StepInputs
from debug_nan.engine.replay.snapshot import Snapshot, capture_rng, restore_rng, schedule_state
from debug_nan.engine.vocabulary import CheckKind
from debug_nan.engine.watch.watch_result import MicroResult

SNAPSHOT_SHARE = 0.005  # the share of a step the copy may cost, amortised over the steps between copies
MAX_SNAPSHOT_EVERY = 16  # at most this many steps re-run (and their batches kept) to bring a copy forward


class StateCopies:
    def __init__(self, snapshot: Snapshot, driver, watch, log, every: int | None, adaptive: bool,
                 distributed: bool = False):
        self.snapshot, self.driver, self.watch, self.log = snapshot, driver, watch, log
        # under DDP every step: a re-run's collectives would need every rank to re-run, and to agree on its check
        self.every = 1 if distributed else every or 1
        self.adaptive = every is None and adaptive and snapshot.kept and not distributed
        self.saved: StepInputs | None = None  # the step whose start the copy holds
        self.since: list[StepInputs] = []  # the steps begun after it, in order
        self.current: StepInputs | None = None
        self.updated = False  # the current step took its optimizer step
        self._read: tuple | None = None  # the watch's last reading of the parameters and optimizer state
        self._failed: dict[int, Reached] = {}  # step -> why its start could not be reached (not re-run twice)
        self._began: float | None = None
        self._step_seconds: float | None = None

    def begin(self, step: int) -> StepInputs:
        """A step begins -> its inputs (the buffers are staged: the copy may be taken after its first sync)."""
        self._began = time.perf_counter()
        # a step's lr and scheduler state, for a re-run through it: only where copies can be steps apart
        rerun = self.snapshot.kept and (self.adaptive or self.every > 1)
        hyper = schedule_state(self.driver.optimizer, self.snapshot.scheduler) if rerun else None
        self.current = StepInputs(step=step, batches=[], rng=[], snapshot=self.snapshot, hyper=hyper)
        self.updated = False
        if self.saved is not None:
            self.since.append(self.current)
        self.snapshot.stage()
        return self.current

    def first_sync(self, result: MicroResult, blames_last_update: bool) -> None:
        """After the step's first sync: keep the watch's reading of the state (read after the last update), and
        take the copy when it is due, unless that sync blames the last update (its copy is the one to replay)."""
        self.read(result)
        self.current.fingerprint = self._read
        due = self.saved is None or self.current.step - self.saved.step >= self.every
        if due and not blames_last_update:
            self._copy()

    def read(self, result: MicroResult) -> None:
        """A sync that read the parameters and optimizer state (a step's first, or the session's finish() before
        an eval pass): the reading stands for the state until the next update."""
        read = result.segment(CheckKind.PARAM)
        if read is not None:
            self._read = (list(read.names), read.value.copy())

    def stepped(self) -> None:
        if self._began is not None:  # a step's own time, from its start to its update (the copy's yardstick)
            self._step_seconds = time.perf_counter() - self._began
        self.updated = True
        self._read = None  # the state changed: the next sync reads it

    def _copy(self) -> None:
        began = time.perf_counter()
        self.snapshot.save()
        self.saved, self.since = self.current, []
        if not (self.adaptive and self._step_seconds):
            return
        took = time.perf_counter() - began
        every = min(MAX_SNAPSHOT_EVERY, max(1, math.ceil(took / (SNAPSHOT_SHARE * self._step_seconds))))
        if every > 1 and self.every == 1:
            self.log(f"  [snapshot] a copy of the state takes {took * 1e3:.0f} ms, {took / self._step_seconds:.0%} "
                     f"of a step: it is taken every {every} steps; a trip in an optimizer step re-runs the steps "
                     f"since (checked against the watch's reading of the run's state)")
        self.every = every

    def at(self, inputs: StepInputs) -> Reached:
        """Make the copy hold the start of `inputs.step` -> REACHED, or why it cannot."""
        if not self.snapshot.kept:
            return missed("no snapshot is kept")
        if self.saved is inputs:
            return REACHED
        if inputs is self.current and not self.updated:
            self._copy()
            return REACHED
        if not self.snapshot.keeps_optimizer:  # a re-run would move the optimizer state the copy does not hold
            return missed("no copy of the optimizer state (--snapshot params) to re-run the steps since the copy "
                          "from")
        chain = [self.saved, *self.since] if self.saved is not None else []
        if inputs not in chain:
            return missed(f"no copy of the state before step {inputs.step} is left")
        if inputs.step in self._failed:
            return self._failed[inputs.step]
        chain = chain[:chain.index(inputs) + 1]
        self.log(f"  [snapshot] re-running steps {chain[0].step}..{inputs.step - 1} from the copy taken at step "
                 f"{chain[0].step}, to the state before step {inputs.step}")
        reached = catch_up(self.driver, chain, self.watch.read_state)
        if not reached.ok:
            self._failed[inputs.step] = reached
            return reached
        self.snapshot.save(live_buffers=True)
        self.since = self.since[self.since.index(inputs) + 1:]
        self.saved = inputs
        return REACHED

    def forget(self) -> None:
        """The live state left the recorded sequence (--keep-going undid an update): the next step copies anew."""
        self.saved, self.since, self._read, self._failed = None, [], None, {}


@contextmanager
def live_state_kept(model, snapshot: Snapshot, device, scaler):
    """Around a probe that re-runs the step while the run goes on afterwards: its gradients, buffers, RNG and the
    scaler's per-step record come back exactly as they were."""
    params = list(model.parameters())
    grads = [p.grad for p in params]
    buffers = [b.detach().clone() for b in model.buffers()]  # (the snapshot's buffer list, in its order)
    rng = capture_rng(device)
    scaler_record = scaler._per_optimizer_states if scaler is not None else None
    try:
        yield
    finally:
        for p, g in zip(params, grads):
            p.grad = g
        snapshot.put_back_buffers(buffers)
        restore_rng(rng, device)
        if scaler is not None:
            scaler._per_optimizer_states = scaler_record


__all__ = ["MAX_SNAPSHOT_EVERY", "SNAPSHOT_SHARE", "StateCopies", "live_state_kept"]
