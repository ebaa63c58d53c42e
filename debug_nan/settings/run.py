"""RunSettings: what a driver of the step session runs with, by component: `watch` (the engine's: all it sees),
`outputs`, and `train` (the CLI's training options, or what a framework callback read from its framework; None
under `debug-nan run`, whose training is the script's own). The CLI's job adds the built-in task's settings
(app/job_settings.py JobSettings). `to_dict()` is the flat record of what the run used: the report's and the
repro bundle's `settings`, by the options' names."""

from __future__ import annotations

from dataclasses import dataclass, field

from debug_nan.settings.outputs import OutputSettings
from debug_nan.settings.tables import flatten, leaves
from debug_nan.settings.training import TrainSettings
from debug_nan.settings.watch import WatchSettings


@dataclass
class RunSettings:
    train: TrainSettings | None = field(default_factory=TrainSettings)
    watch: WatchSettings = field(default_factory=WatchSettings)
    outputs: OutputSettings = field(default_factory=OutputSettings)

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step (1 where the training is the script's: a step is what it does)."""
        return self.train.gradient_accumulation_steps if self.train is not None else 1

    def to_dict(self) -> dict:
        return flatten(self)

    def validate(self) -> None:
        for _, component in leaves(self):
            component.validate()
