"""Findings of a trip that the op-level replay could not name: interrupted (Ctrl-C / SIGTERM during the replay)
or impossible (--snapshot off: no state to replay from; --snapshot params: no optimizer state). The watch's check
stands, without the op."""

from __future__ import annotations

from debug_nan.engine.explain.evidence import watch_only_finding
from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.replay.driver import TaskFailure
from debug_nan.engine.replay.snapshot import NO_OPTIMIZER_COPY, NO_SNAPSHOT
from debug_nan.engine.replay.trip import Trip
from debug_nan.errors import describe_exception


class InterruptedPinpoint(KeyboardInterrupt):
    """An interrupt during the pinpoint replay, carrying the watch-only finding of the trip that started it."""


def interrupted_pinpoint(exc: KeyboardInterrupt, trip: Trip, model) -> InterruptedPinpoint:
    """Ctrl-C / SIGTERM during the replay: the watch's trip stays a finding (watch-only, with a note)."""
    what = exc.args[0] if exc.args else "Ctrl-C"
    interrupt = InterruptedPinpoint(*exc.args)
    interrupt.finding = watch_only_finding(trip.step, trip.micro, trip.batch, trip.check, model,
                                           why=f"the op-level replay was interrupted ({what}) before it named the op.")
    return interrupt


def unreplayed_finding(trip: Trip, model, log, kept: bool = False, reason: str | None = None) -> Finding:
    """The watch's finding, without the op: --snapshot off (no state to replay from), --snapshot params for an
    optimizer-phase trip (`kept`: no copy of the optimizer state), or `reason` (the state before the failing
    step could not be reached from the copy: engine/replay/catch_up.py)."""
    why = f"{reason}; the op was not replayed." if reason else NO_OPTIMIZER_COPY if kept else NO_SNAPSHOT
    log(f"  [watch] TRIP at step {trip.step}, micro-batch {trip.micro}: {why}", "red")
    if trip.check is None:
        raise TaskFailure(f"step {trip.step}, micro-batch {trip.micro}: {describe_exception(trip.error)}; {why}")
    return watch_only_finding(trip.step, trip.micro, trip.batch, trip.check, model, why=why)
