"""What a callback leaves behind: the CLI's summary block on stderr (the script's stdout stays its own, byte for
byte, as under `debug-nan run`), the JSON report and the repro bundles.

The options are checked when the callback is built (a report path that cannot be written fails before any
training time is spent); the log opens when training starts (a callback may be pickled into worker processes).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from debug_nan.engine.session.outcome import RunResult
from debug_nan.errors import InputError, describe_exception
from debug_nan.presentation.log import Log
from debug_nan.presentation.outputs import OutputWriteError, check_writable
from debug_nan.presentation.summary import report_dict, write_report, write_summary
from debug_nan.settings import RunSettings

ON_TRIP = ("stop", "raise")


class RankLog(Log):
    """Another rank's lines on the shared stderr, marked with the rank."""

    def __init__(self, rank: int, stream=None):
        super().__init__(None, stream=stream)
        self.rank = rank

    def __call__(self, line: str = "", colour: str | None = None) -> None:
        super().__call__(f"[rank {self.rank}] {line}" if line else line, colour)


class Outputs:
    def __init__(self, report: str | None, bundle_dir: str | None, bundle: bool, log: str | None, on_trip: str):
        if on_trip not in ON_TRIP:
            raise InputError(f"on_trip={on_trip!r}: use 'stop' (end training, model left at its last finite "
                             f"state) or 'raise' (raise debug_nan.NonFiniteError out of the fit/train call).")
        check_writable(report, "report=")
        check_writable(log, "log=")
        if bundle_dir is not None and Path(bundle_dir).is_file():
            raise InputError(f"bundle_dir={bundle_dir} is a file; give a folder.")
        self.report, self.log_path, self.on_trip = report, log, on_trip
        # as in the CLI: bundles beside the report unless a folder is given; none without either
        self.bundle_dir = (bundle_dir or (str(Path(report).parent) if report else None)) if bundle else None
        self.log: Log | None = None
        self.started = time.perf_counter()
        self.result: RunResult | None = None
        self.write_failure: str | None = None  # why the report could not be written (a full disk), for the caller

    def open(self, rank: int = 0) -> Log:
        """The log for this rank: rank 0 writes stderr (and the copy), the others mark their lines."""
        if self.log is None:
            self.log = Log(self.log_path, stream=sys.stderr) if rank == 0 else RankLog(rank, stream=sys.stderr)
        self.started = time.perf_counter()
        return self.log

    def conclude(self, monitor, settings: RunSettings, integration: dict, write: bool = True,
                 error: BaseException | None = None, interrupted: bool = False, rank: int = 0,
                 exit_code=None) -> RunResult:
        """The summary block and the JSON report, once per run (later calls return the first result).
        `exit_code(result)`: the process's exit code where the caller decides it (debug-nan run); else the report's
        exit_code is null, the framework's to decide."""
        if self.result is not None:
            return self.result
        optimizer = monitor.optimizer
        result = RunResult(status="clean", steps_run=monitor.steps_run, findings=list(monitor.findings),
                           history=monitor.history, notes=list(monitor.notes), interrupted=interrupted,
                           recipe={"optimizer": type(optimizer).__name__ if optimizer is not None else
                                   "the script's own update",
                                   "lr": optimizer.param_groups[0].get("initial_lr", optimizer.param_groups[0]["lr"])
                                   if optimizer is not None else None,
                                   "max_grad_norm": settings.max_grad_norm,
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
        elapsed = time.perf_counter() - self.started
        write_summary(self.log, result, elapsed, exits=exit_code is not None)
        if self.report:
            path = self.report if rank == 0 else _rank_path(self.report, rank)
            data = report_dict(result, settings, monitor.device, elapsed)
            data["integration"] = integration
            data["exit_code"] = result.exit_code  # None: the framework's (the script's) to decide
            try:
                write_report(path, data)
                self.log(f"JSON report written to {path}")
            except OutputWriteError as exc:  # the user's training must not fail at its end for our report
                self.write_failure = str(exc)
                self.log(f"  could not write the JSON report: {exc}", "yellow")
        self.log.close()
        return result


class CallbackOutcome:
    """What a framework callback answers after training: `.finding` (the first Finding or None) and `.status`
    ("clean" | "nonfinite" | "error"), from its `driver` and `outputs`."""

    outputs: Outputs

    @property
    def finding(self):
        return self.driver.findings[0] if self.driver is not None and self.driver.findings else None

    @property
    def status(self) -> str | None:
        return self.outputs.result.status if self.outputs.result is not None else None


def _rank_path(path: str, rank: int) -> str:
    """Another rank writing alone (user code raised there): report.json -> report.rank1.json."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}.rank{rank}{p.suffix}"))


def run_settings(outputs: Outputs, *, task: str | None, device, optimizer, accumulation: int, precision: str,
                 max_grad_norm: float | None, max_steps: int, seed: int, explosion_threshold: float,
                 explosion_growth: float, snapshot_every: int | None = None,
                 outputs_every: int | None = None) -> RunSettings:
    """The framework's recipe in the CLI's settings (the report's `settings`, and a bundle's, so that
    `debug-nan replay BUNDLE` rebuilds the same step from `task`)."""
    group = optimizer.param_groups[0] if optimizer is not None else {"lr": 0.0}  # (None: a hand-written update)
    return RunSettings(task=task, device=str(device), max_steps=max(1, max_steps),
                       gradient_accumulation_steps=accumulation, lr=float(group["lr"]),
                       weight_decay=float(group.get("weight_decay", 0.0)), warmup_steps=0,
                       max_grad_norm=max_grad_norm or None, precision=precision, seed=seed,
                       explosion_threshold=explosion_threshold, explosion_growth=explosion_growth,
                       snapshot_every=snapshot_every or 0, outputs_every=outputs_every or 0,
                       report=outputs.report, log=outputs.log_path,
                       bundle_dir=outputs.bundle_dir, bundle=outputs.bundle_dir is not None)
