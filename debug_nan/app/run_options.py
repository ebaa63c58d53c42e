"""`RunOptions`: the options of `debug-nan run`, the same in every watched process (passed to them as JSON by
app/run_folder.py). No torch: the top process of `debug-nan run -- PROGRAM` only starts the program and reads
its ranks' results (app/run_program.py)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from debug_nan.settings import OutputSettings, RunSettings, WatchSettings


@dataclass
class RunOptions:
    report: str | None = None
    log: str | None = None
    max_steps: int | None = None
    explosion_threshold: float = WatchSettings.explosion_threshold  # the watch's defaults
    explosion_growth: float = WatchSettings.explosion_growth
    deterministic: bool = False  # torch.use_deterministic_algorithms in the run
    bundle_dir: str | None = None  # where a finding's repro bundle goes (None: --no-bundle)
    start_dir: str = field(default_factory=os.getcwd)  # the user's folder: the bundle's path is shown from it
    trace_at: tuple[int, int] | None = None  # --trace-at STEP:MICRO: that micro-batch traced as it runs
    command: list[str] | None = None  # the command as typed (set by the cli)
    plot: str | None = None  # --plot, --tensorboard, --history: as for the job
    tensorboard: str | None = None
    history: str = OutputSettings.history

    def report_settings(self) -> dict:
        """The report's `settings`: the options this run used (none of the job's AAM or training knobs)."""
        return {"report": self.report, "log": self.log, "plot": self.plot, "tensorboard": self.tensorboard,
                "history": self.history, "max_steps": self.max_steps, "explosion_threshold": self.explosion_threshold,
                "explosion_growth": self.explosion_growth, "deterministic": self.deterministic,
                "bundle_dir": self.bundle_dir, "bundle": self.bundle_dir is not None,
                "trace_at": list(self.trace_at) if self.trace_at else None}

    def settings(self) -> RunSettings:
        """The watch's and the outputs' settings of this run; the training is the script's own (none of debug-nan's:
        no train component)."""
        watch = WatchSettings(explosion_threshold=self.explosion_threshold, explosion_growth=self.explosion_growth)
        outputs = OutputSettings(report=self.report, log=self.log, plot=self.plot, bundle_dir=self.bundle_dir,
                                 bundle=self.bundle_dir is not None, history=self.history,
                                 tensorboard=self.tensorboard)
        return RunSettings(train=None, watch=watch, outputs=outputs)
