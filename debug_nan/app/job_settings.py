"""JobSettings: the CLI job's settings, by component: the built-in task's (aam/settings.py: [data], [model]), the
training's ([train]), the watch's ([checks]) and the outputs' ([output]). Defaults <- the TOML config <- explicit
flags (build_settings); LAYOUT reads the structure once: the config's tables (SECTIONS), every setting's
component, type, choices and default (the options' help, app/cli_options.py; its groups, app/cli_help.py).

A driver reads the component it needs (`s.train.lr`, `s.watch.snapshot`: the engine only the watch's); a --task
factory is given the flat view (`for_task()`: `settings.batch_size`, `settings.seed`, as it always was); the
report's and the repro bundle's `settings` are the flat record (`to_dict()`), read back by `from_flat` (a bundle's,
of this layout or of the one flat RunSettings before it: the same names)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from debug_nan.aam.settings import AAMSettings
from debug_nan.errors import InputError
from debug_nan.settings import Layout, OutputSettings, TrainSettings, WatchSettings
from debug_nan.settings.tables import flatten, leaves


@dataclass
class JobSettings:
    aam: AAMSettings = field(default_factory=AAMSettings)
    train: TrainSettings = field(default_factory=TrainSettings)
    watch: WatchSettings = field(default_factory=WatchSettings)
    outputs: OutputSettings = field(default_factory=OutputSettings)

    @property
    def accumulation_steps(self) -> int:
        return self.train.gradient_accumulation_steps

    def to_dict(self) -> dict[str, Any]:
        """Flat, in the config's tables' order (SECTIONS)."""
        values = flatten(self)
        return {name: values[name] for names in SECTIONS.values() for name in names}

    def for_task(self) -> SimpleNamespace:
        """What a --task factory is given: every setting by its flat name (`settings.batch_size`), a copy."""
        return SimpleNamespace(**self.to_dict())

    @classmethod
    def from_flat(cls, values: dict[str, Any]) -> JobSettings:
        """From flat {name: value} (missing names at their defaults; an unknown name: TypeError)."""
        return LAYOUT.build(values)

    def validate(self) -> None:
        """Range checks that do not need the data, component by component; each message names the option."""
        for _, component in leaves(self):
            component.validate()
        if self.train.eval_every is None and self.aam.data.eval_samples is not None:
            raise InputError("--eval-samples sets up the eval pass, which runs only with --eval-every N; add it.")


LAYOUT = Layout(JobSettings, examples="token_limit in [data], d_model in [model], lr in [train]")
SECTIONS = LAYOUT.sections  # table -> setting names: [data], [model], [train], [checks], [output]


def load_config(path) -> dict[str, Any]:
    """A TOML job config -> {setting: value}, every table, key and value checked (settings/tables.py)."""
    return LAYOUT.load_config(path)


def build_settings(config_path: str | None, overrides: dict[str, Any]) -> JobSettings:
    """Defaults <- config file <- explicit flags (entries of `overrides` that are not None), validated."""
    values: dict[str, Any] = {}
    if config_path:
        values.update(load_config(config_path))
    values.update({k: v for k, v in overrides.items() if v is not None})
    settings = JobSettings.from_flat(values)
    settings.validate()
    return settings
