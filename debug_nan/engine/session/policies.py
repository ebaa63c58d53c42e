"""SessionPolicies: what differs between entry points (everything else is the step session's), built in one
place from each entry point's watch settings (settings/watch.py: all the engine sees of the settings) and what
only the entry point knows: SessionPolicies.from_settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from debug_nan.engine.session.agreement import RankAgreement
from debug_nan.settings.watch import WatchSettings


@dataclass
class SessionPolicies:
    """What differs between entry points; everything else is the session's."""

    scaler: object | None = None  # an enabled torch.amp.GradScaler, or None
    agreement: RankAgreement | None = None  # DDP: every rank takes the same decision
    agree_on_errors: bool = True  # DDP: user code raising is agreed on too (False where the framework's backward
    # may already be inside a gradient all-reduce on the other ranks: that rank decides alone)
    averaged_after_watch: bool = False  # DDP: the watch read this rank's own gradients; the averaged ones are read
    # for the explosion check and clipping (the Trainer's overlapped all-reduce)
    bundle_sink: Callable[[dict], str] | None = None  # writes a repro bundle, returns its path
    explosion: tuple[float, float] | None = (1e4, 1e3)  # (threshold, growth) of the gradient-norm explosion check
    dialect: str = "cli"  # the advice's wording (checks/vocabulary.DIALECTS): "cli" flags, or the arguments of
    # "api" (the Monitor, debug-nan run), "lightning" or "hf"
    snapshot_mode: str = "host"
    snapshot_every: int | None = None  # copy the state every N steps; None: as often as costs at most 0.5% of
    # a step, measured on the CPU (engine/session/copies.py); every step on CUDA (the copy overlaps the step) and
    # under DDP
    scheduler: object | None = None  # restored by a replay with the rest of the state
    outputs_every: int | None = None  # measure module outputs every N steps; None: every step up to step 16, then
    # as often as costs at most 0.5% of a step, measured on the CPU (engine/session/output_schedule.py); every step
    # on CUDA

    @classmethod
    def from_settings(cls, s: WatchSettings, dialect: str, *, scaler=None, agreement: RankAgreement | None = None,
                      agree_on_errors: bool = True, averaged_after_watch: bool = False,
                      bundle_sink: Callable[[dict], str] | None = None, scheduler=None) -> SessionPolicies:
        """The one place where settings become the session's policies: every entry point calls it with its watch
        settings (the CLI's options, a callback's arguments, the Monitor's, `run`'s) and what only it knows."""
        return cls(scaler=scaler, agreement=agreement, agree_on_errors=agree_on_errors,
                   averaged_after_watch=averaged_after_watch, bundle_sink=bundle_sink,
                   explosion=(s.explosion_threshold, s.explosion_growth), dialect=dialect, snapshot_mode=s.snapshot,
                   snapshot_every=s.snapshot_every or None, scheduler=scheduler, outputs_every=s.outputs_every or None)
