"""What a callback (and `debug-nan run`) leaves behind, through the CLI's output pipeline (presentation/pipeline.py):
the history table and the summary block on stderr (the script's stdout stays its own, byte for byte), the JSON
report, the plot and TensorBoard events asked for, and the repro bundles.

The options are checked when the callback is built (a report path that cannot be written fails before any
training time is spent); the log opens when training starts (a callback may be pickled into worker processes).
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

from debug_nan.engine.session.result import RunResult
from debug_nan.errors import InputError, describe_exception
from debug_nan.presentation.history_plot import check_plot_available
from debug_nan.presentation.log import Log, RankMarked
from debug_nan.presentation.outputs import check_writable, rank_path
from debug_nan.presentation.pipeline import OutputOptions, Presented, present
from debug_nan.presentation.tensorboard import check_tensorboard
from debug_nan.settings import OutputSettings, RunSettings, TrainSettings, WatchSettings

ON_TRIP = ("stop", "raise")


# the settings a callback runs with: its own options and what it reads from the framework (the report's
# `settings`; its RunSettings' other fields are settings the callback has not, at their defaults)
CALLBACK_SETTINGS = ("task", "device", "max_steps", "gradient_accumulation_steps", "precision", "max_grad_norm",
                     "seed", "explosion_threshold", "explosion_growth", "snapshot_every", "outputs_every", "report",
                     "log", "bundle_dir", "bundle")


class Outputs:
    def __init__(self, report: str | None, bundle_dir: str | None, bundle: bool, log: str | None, on_trip: str,
                 plot: str | None = None, tensorboard: str | None = None, history: str = "compact"):
        if on_trip not in ON_TRIP:
            raise InputError(f"on_trip={on_trip!r}: use 'stop' (end training, model left at its last finite "
                             f"state) or 'raise' (raise debug_nan.NonFiniteError out of the fit/train call).")
        check_writable(report, "report=")
        check_writable(log, "log=")
        check_writable(plot, "--plot")  # (run's: the callbacks take no plot or TensorBoard folder)
        check_plot_available(plot)
        check_tensorboard(tensorboard)
        if bundle_dir is not None and Path(bundle_dir).is_file():
            raise InputError(f"bundle_dir={bundle_dir} is a file; give a folder.")
        self.report, self.log_path, self.on_trip = report, log, on_trip
        self.plot, self.tensorboard, self.history = plot, tensorboard, history
        # as in the CLI: bundles beside the report unless a folder is given; none without either
        self.bundle_dir = (bundle_dir or (str(Path(report).parent) if report else None)) if bundle else None
        self.log: Log | None = None
        self.started = time.perf_counter()
        self.result: RunResult | None = None
        self.presented = Presented()  # what could not be written (a full disk), for the caller

    def settings(self) -> OutputSettings:
        """These outputs as the run's output settings (what it writes: the report's and a bundle's record)."""
        return OutputSettings(report=self.report, log=self.log_path, plot=self.plot, bundle_dir=self.bundle_dir,
                              bundle=self.bundle_dir is not None, history=self.history,
                              tensorboard=self.tensorboard)

    def open(self, rank: int = 0) -> Log:
        """The log for this rank: rank 0 writes stderr (and the copy), the others mark their lines."""
        if self.log is None:
            self.log = Log(self.log_path, stream=sys.stderr) if rank == 0 else Log(None, stream=RankMarked(rank))
        self.started = time.perf_counter()
        return self.log

    def conclude(self, monitor, settings: RunSettings, integration: dict, write: bool = True,
                 error: BaseException | None = None, interrupted: bool = False, rank: int = 0,
                 exit_code=None, report_settings: dict | None = None) -> RunResult:
        """The history table, the JSON report, the plot and TensorBoard events asked for, and the summary block,
        once per run (later calls return the first result), through the one output pipeline. `exit_code(result)`:
        the process's exit code where the caller decides it (debug-nan run); else the report's exit_code is null,
        the framework's to decide. `report_settings`: the report's `settings` (default: a callback's,
        CALLBACK_SETTINGS of `settings` and on_trip). Another rank writing alone (user code raised there) writes
        its report beside rank 0's (report.rank1.json), and no plot or TensorBoard events."""
        if self.result is not None:
            return self.result
        optimizer = monitor.optimizer
        result = RunResult(status="clean", steps_run=monitor.steps_run, findings=list(monitor.findings),
                           history=monitor.history, notes=list(monitor.notes), interrupted=interrupted,
                           recipe={"optimizer": type(optimizer).__name__ if optimizer is not None else
                                   "the script's own update",
                                   "lr": optimizer.param_groups[0].get("initial_lr", optimizer.param_groups[0]["lr"])
                                   if optimizer is not None else None,
                                   "max_grad_norm": settings.train.max_grad_norm
                                   if settings.train is not None else None,
                                   "from": {"optimizer": integration["framework"]}})
        result.finding = result.findings[0] if result.findings else None
        if result.finding is not None:
            result.status = "nonfinite"
        elif monitor.error is not None or error is not None:
            result.status, result.error = "error", monitor.error or describe_exception(error)
        if exit_code is not None:  # the caller knows the process's code: the summary and report say it
            result.exit_code = exit_code(result)
        self.result = result
        if not write or self.log is None:
            return result
        if report_settings is None:
            used = settings.to_dict()
            report_settings = {**{name: used[name] for name in CALLBACK_SETTINGS}, "on_trip": self.on_trip}
        options = OutputOptions(self.report if rank == 0 or not self.report else rank_path(self.report, rank),
                                self.plot if rank == 0 else None, self.tensorboard if rank == 0 else None,
                                self.history)
        self.presented = present(self.log, result, monitor.model, options, settings=report_settings,
                                 device=monitor.device, elapsed=time.perf_counter() - self.started,
                                 extra={"integration": integration}, exits=exit_code is not None)
        return result


@dataclass
class CallbackOptions:
    """The options of both framework callbacks (Lightning's and HF's DebugNaNCallback), as they were given.

    report: JSON report path (the CLI's --report format, plus an "integration" block). bundle_dir: where repro
    bundles go (default: beside the report; none without a report); bundle=False writes none. log: a copy of the
    log lines. on_trip: "stop" (the framework's own stop; the model is left at its last finite state) or "raise"
    (debug_nan.NonFiniteError out of the fit / train call). task: a `--task` spec that rebuilds the model, its loss
    and optimizer, recorded in bundles so that `debug-nan replay BUNDLE` works. explosion_threshold /
    explosion_growth: the gradient explosion check's, as the CLI's. snapshot_every: copy the state every N steps
    (None: engine/session/copies.py chooses); outputs_every: measure module outputs every N steps (None:
    engine/session/output_schedule.py chooses)."""

    report: str | None = None
    bundle_dir: str | None = None
    bundle: bool = True
    log: str | None = None
    on_trip: str = "stop"
    task: str | None = None
    explosion_threshold: float = 1e4
    explosion_growth: float = 1e3
    snapshot_every: int | None = None
    outputs_every: int | None = None

    def settings(self, outputs: Outputs, **recipe) -> RunSettings:
        """These options with what the callback reads from its framework (`recipe`: run_settings' device,
        optimizer, accumulation, precision, max_grad_norm, max_steps, seed)."""
        return run_settings(outputs, task=self.task, explosion_threshold=self.explosion_threshold,
                            explosion_growth=self.explosion_growth, snapshot_every=self.snapshot_every,
                            outputs_every=self.outputs_every, **recipe)


class FrameworkCallback:
    """What both framework callbacks share: their options (checked as the callback is built: a report path that
    cannot be written fails before any training time is spent), their outputs, and what they answer after
    training: `.finding` (the first Finding or None) and `.status` ("clean" | "nonfinite" | "error"), from their
    `driver` (a FrameworkDriver, built when training starts) and `outputs`."""

    def __init__(self, report: str | None = None, bundle_dir: str | None = None, *, bundle: bool = True,
                 log: str | None = None, on_trip: str = "stop", task: str | None = None,
                 explosion_threshold: float = 1e4, explosion_growth: float = 1e3, snapshot_every: int | None = None,
                 outputs_every: int | None = None):
        self.options = CallbackOptions(report, bundle_dir, bundle, log, on_trip, task, explosion_threshold,
                                       explosion_growth, snapshot_every, outputs_every)
        self.outputs = Outputs(report, bundle_dir, bundle, log, on_trip)
        self.driver = None
        self.outside = None  # the model's forwards outside training (drivers/eval_forwards.py), while it trains

    @property
    def finding(self):
        return self.driver.findings[0] if self.driver is not None and self.driver.findings else None

    @property
    def status(self) -> str | None:
        return self.outputs.result.status if self.outputs.result is not None else None

    def found_outside(self, finding) -> bool:
        """A forward outside training (validation, evaluation: drivers/eval_forwards.py) made NaN/+Inf: the finding
        kept, the run stopped as at a training trip (not under DDP: one rank cannot stop the others from there)
        -> whether the run stopped."""
        self.outside.evals.found(finding, stop=self.driver.dist is None)
        return self.driver.stopped

    def conclude(self, integration: dict, *, rank: int, write: bool, error: BaseException | None = None,
                 interrupted: bool = False) -> None:
        """The run's end: the watch closed, the forwards outside training no longer watched, every output written
        (the report's `integration`: the framework's own words, with the callback's on_trip)."""
        m = self.driver
        m.close()
        if self.outside is not None:
            self.outside.remove()
        self.outputs.conclude(m, m.s, {**integration, "on_trip": self.outputs.on_trip}, write=write, error=error,
                              interrupted=interrupted, rank=rank)


def run_settings(outputs: Outputs, *, task: str | None, device, optimizer, accumulation: int, precision: str,
                 max_grad_norm: float | None, max_steps: int | None, seed: int | None, explosion_threshold: float,
                 explosion_growth: float, snapshot_every: int | None = None,
                 outputs_every: int | None = None) -> RunSettings:
    """The framework's recipe as training settings, the callback's options as the watch's and the outputs' (the
    report's `settings`, and a bundle's, so that `debug-nan replay BUNDLE` rebuilds the same step from `task`):
    no setting of the CLI's built-in task. What the framework does not know is None (Lightning's max_steps -1: no
    limit; no seed set), never a default."""
    group = optimizer.param_groups[0] if optimizer is not None else {"lr": 0.0}  # (None: a hand-written update)
    train = TrainSettings(task=task, device=str(device), max_steps=max_steps if max_steps and max_steps > 0 else None,
                          gradient_accumulation_steps=accumulation, lr=float(group["lr"]),
                          weight_decay=float(group.get("weight_decay", 0.0)), warmup_steps=0,
                          max_grad_norm=max_grad_norm or None, precision=precision, seed=seed)
    watch = WatchSettings(explosion_threshold=explosion_threshold, explosion_growth=explosion_growth,
                          snapshot_every=snapshot_every or 0, outputs_every=outputs_every or 0)
    return RunSettings(train=train, watch=watch, outputs=outputs.settings())
