"""Findings of a trip that the op-level replay could not name: interrupted (Ctrl-C / SIGTERM during the replay)
or impossible (--snapshot off: no state to replay from; --snapshot params: no optimizer state). The watch's check stands, without the op."""

from __future__ import annotations

from debug_nan.engine.replay.driver import StepInputs, TaskFailure
from debug_nan.engine.explain.finding import Finding, watch_only_finding
from debug_nan.engine.replay.snapshot import NO_OPTIMIZER_COPY, NO_SNAPSHOT
from debug_nan.errors import describe_exception
from debug_nan.engine.session.outcome import MicroOutcome


class InterruptedPinpoint(KeyboardInterrupt):
    """An interrupt during the pinpoint replay, carrying the watch-only finding of the trip that started it."""


def interrupted_pinpoint(exc: KeyboardInterrupt, inputs: StepInputs, micro: int, check, model) -> InterruptedPinpoint:
    """Ctrl-C / SIGTERM during the replay: the watch's trip stays a finding (watch-only, with a note)."""
    what = exc.args[0] if exc.args else "Ctrl-C"
    interrupt = InterruptedPinpoint(*exc.args)
    interrupt.finding = watch_only_finding(inputs.step, micro, inputs.batches[micro - 1], check, model,
                                           why=f"the op-level replay was interrupted ({what}) before it named the op.")
    return interrupt


def unreplayed_finding(o: MicroOutcome, accumulation_steps: int, model, log, kept: bool = False,
                       reason: str | None = None) -> Finding:
    """The watch's finding, without the op: --snapshot off (no state to replay from), --snapshot params for an
    optimizer-phase trip (`kept`: no copy of the optimizer state), or `reason` (the state before the failing
    step could not be reached from the copy: engine/replay/catch_up.py)."""
    why = f"{reason}; the op was not replayed." if reason else NO_OPTIMIZER_COPY if kept else NO_SNAPSHOT
    param = o.check is not None and o.check.kind == "param" and o.previous is not None
    inputs, micro = (o.previous, accumulation_steps) if param else (o.inputs, o.micro)
    log(f"  [watch] TRIP at step {inputs.step}, micro-batch {micro}: {why}", "red")
    if o.check is None:
        raise TaskFailure(f"step {inputs.step}, micro-batch {micro}: {describe_exception(o.error)}; {why}")
    return watch_only_finding(inputs.step, micro, inputs.batches[micro - 1], o.check, model, why=why)
