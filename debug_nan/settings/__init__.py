"""The settings, by component: a dataclass each, read from defaults, then a TOML config file, then explicit flags.

tables.py (the structure read generically: components, composites, the TOML config's tables and its errors) ;
watch.py (WatchSettings, [checks]: all the engine sees) ; training.py (TrainSettings, [train]) ; outputs.py
(OutputSettings, [output]) ; run.py (RunSettings: the three, what every driver runs with). The built-in task's
settings are its own (aam/settings.py: [data], [model]); the CLI's job composes them all (app/job_settings.py).
"""

from debug_nan.settings.outputs import OutputSettings
from debug_nan.settings.run import RunSettings
from debug_nan.settings.tables import Layout, tomllib
from debug_nan.settings.training import TrainSettings
from debug_nan.settings.watch import WatchSettings

__all__ = ["Layout", "OutputSettings", "RunSettings", "TrainSettings", "WatchSettings", "tomllib"]
