"""WatchSettings: the checks' settings, the config's [checks] table, and all of the settings the engine sees
(engine/session/policies.py builds the step session's policies from them)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from debug_nan.errors import InputError
from debug_nan.settings.tables import check_choices, setting


@dataclass
class WatchSettings:
    TABLE: ClassVar[str] = "checks"
    TITLE: ClassVar[str] = "Check options (the watch, the snapshot, the replay)"

    trace_every_step: bool = False  # print the full layer-by-layer trace every step
    keep_going: bool = False  # record a finding and go on, skipping that step's update
    explosion_threshold: float = 1e4  # a gradient norm past this...
    explosion_growth: float = 1e3  # ...and that many times the smallest earlier norm is an explosion
    snapshot: str = setting("host", choices=("host", "device", "params", "off"))  # where the replay's copy
    # of the state lives (engine/replay/snapshot.py SNAPSHOT_MODES)
    snapshot_every: int = 0  # copy the state every N steps; 0: auto (engine/session/copies.py)
    outputs_every: int = 0  # measure module outputs every N steps; 0: auto (engine/session/output_schedule.py)

    def validate(self) -> None:
        """Range checks; each message names the option."""
        for name in ("explosion_threshold", "explosion_growth"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise InputError(f"--{name.replace('_', '-')} must be a positive finite number, got {value}.")
        if self.snapshot_every < 0:
            raise InputError(f"--snapshot-every must be >= 0 (0: chosen from what a copy costs), got "
                             f"{self.snapshot_every}.")
        if self.outputs_every < 0:
            raise InputError(f"--outputs-every must be >= 0 (0: chosen from what measuring them costs), got "
                             f"{self.outputs_every}.")
        check_choices(self)
        if self.keep_going and self.snapshot in ("off", "params"):
            raise InputError("--keep-going skips a failing step's update by restoring the snapshot taken before it; "
                             f"with --snapshot {self.snapshot} it cannot undo an optimizer step: use --snapshot host "
                             "(or device), or --stop-at-first.")
