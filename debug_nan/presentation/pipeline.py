"""From a run's result to everything the user reads, the same for every entry point (the job, `debug-nan run`,
`debug-nan replay`, the callbacks): the history table, the JSON report, the heat map, the TensorBoard events, then
the summary (the log's last block) and where each output went.

One rule for an output that cannot be written (a full disk): the others are still written; where the process's
exit code is debug-nan's (the job, `run`, `replay`) it becomes 2, the summary and the report say so and the caller
ends with the reason; under a callback (the framework's code) the log says so and training ends as it would.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from debug_nan.presentation.history_plot import plot_history
from debug_nan.presentation.history_table import history_lines
from debug_nan.presentation.line_width import LINE_WIDTH, log_width
from debug_nan.presentation.outputs import OutputWriteError
from debug_nan.presentation.report import build_report, write_report
from debug_nan.presentation.summary import exit_code, finding_lines, write_summary
from debug_nan.presentation.tensorboard import finding_markdown, write_tensorboard
from debug_nan.process import streams


@dataclass(frozen=True)
class Presented:
    """What present() could not write: each output's reason (none: every output was written)."""

    failures: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def why(self) -> str:
        """Every output that could not be written, in one paragraph ('' when all were)."""
        return " ".join(self.failures)


@dataclass
class OutputOptions:
    """Where a run's outputs go (None: not asked for) and how its history table reads: the job's and `run`'s
    --report, --plot, --tensorboard, --history, --quiet; a callback's report=."""

    report: str | None = None
    plot: str | None = None
    tensorboard: str | None = None
    history: str = "compact"  # "full": every module with parameters
    quiet: bool = False  # no history table


def tensorboard_texts(result) -> dict[str, str]:
    """The run's status and its first finding, as the summary prints them."""
    texts = {"status": f"{result.status}, {result.steps_run} step(s) run"}
    if result.finding is not None:
        texts["finding"] = finding_markdown(finding_lines(result.finding))
    if result.error:
        texts["error"] = result.error
    return texts


def present(log, result, model, options: OutputOptions, *, settings: dict | None, device, elapsed: float,
            extra: dict | None = None, exits: bool = True, interrupted_by: str = "Ctrl-C",
            report_of: Callable[[object, int | None], dict] | None = None) -> Presented:
    """Write every output of `result` (a RunResult; `model`, an nn.Module or its history_rows.Layout, names the
    history's rows) and close the log. `settings`, `device`, `extra`: the report's (build_report). `exits`: the
    process ends with the result's exit code (the report's `exit_code`; None under a callback). `report_of(result,
    exit_code)`: the report where it is more than the result's own (the one answer of `debug-nan run -- PROGRAM`,
    made from its ranks' reports) -> what could not be written."""
    full, found = options.history == "full", result.finding.module if result.finding is not None else None
    if result.history.steps and not options.quiet:
        log()
        log.rule(f"HISTORY (per layer, {len(result.history.steps)} step(s))")
        # as wide as the log's lines (DEBUG_NAN_LOG_WIDTH; 0, never wrap, keeps the default table width)
        for line in history_lines(result.history, model, full, found, width=log_width() or LINE_WIDTH):
            log(line)
    if log.copy_failure:
        result.notes.append(log.copy_failure)
    result.notes.extend(streams.notes())
    if log.stdout_closed and not streams.failure("stdout"):
        result.notes.append("stdout was closed (e.g. `| head`): the rest of the log went to --log and the report only.")

    def report() -> dict:
        code = exit_code(result) if exits else None
        if report_of is not None:
            return report_of(result, code)
        return build_report(result, exit_code=code, settings=settings, device=device, elapsed=elapsed, **(extra or {}))

    failures, written = [], []
    if options.report:
        try:
            write_report(options.report, report())
            written.append(f"JSON report written to {options.report}")
        except OutputWriteError as exc:
            failures.append(str(exc))
    if options.plot and result.history.steps:
        try:
            plot_history(result.history, model, options.plot, full, found)
            written.append(f"heat map written to {options.plot}")
        except OutputWriteError as exc:
            failures.append(str(exc))
    if options.tensorboard and result.history.steps:
        try:
            event = write_tensorboard(options.tensorboard, result.history, model, tensorboard_texts(result))
            written.append(f"TensorBoard events written to {event} (tensorboard --logdir {options.tensorboard})")
        except OutputWriteError as exc:
            failures.append(str(exc))
    if failures and exits:
        result.notes.append(f"The run itself ended with exit {exit_code(result)}; exit 2 because an output could not "
                            f"be written: {' '.join(failures)}")
        result.exit_code = 2
        if written and written[0].startswith("JSON"):  # the report says the real exit code too
            try:
                write_report(options.report, report())
            except OutputWriteError:
                pass
    write_summary(log, result, elapsed, interrupted_by, exits=exits)
    for line in written:
        log(line)
    if not exits:  # the framework's run must not fail at its end for our outputs
        for failure in failures:
            log(f"  could not write an output: {failure}", "yellow")
    log.close()
    return Presented(tuple(failures))
