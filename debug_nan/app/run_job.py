"""`debug-nan run -- COMMAND`: the user's own training command, unmodified, watched from outside.

The spine, top to bottom in this file: the cli resolves the command (app/command.py); a program (torchrun, a
shell script, `accelerate launch`) goes to app/run_program.py, which starts it with the start-up hook and gives the
one answer of all its processes (without importing torch: that process never trains). A Python command comes to
`run_command`, which runs it in this process: `Watch.run` runs it with torch's global hooks (drivers/run/hooks.py)
telling the `Watch` its events, and returns an `Ending`, the value that says how it ended; `finish(watch, ending)`
settles the run from that value (the last checks, the summary, the JSON report) and gives the exit code. A process
of a program that trains runs the same `Watch` and `finish` from the hook (app/run_hook.py), its Ending made where
it stops.

debug-nan's own lines go to stderr (and --log), so the script's stdout is byte for byte what it prints without
debug-nan. On a trip the failing micro-batch (or update) is replayed in place, at once, from the run's own state
at that step and the tape of the script's code (drivers/run/tape.py); the script is stopped, the summary and the
JSON report follow, exit 1. A clean run exits with the script's own code.
"""

from __future__ import annotations

import io
import os
import sys
import traceback

from debug_nan.app import command as commands
from debug_nan.app import run_paths as paths
from debug_nan.app.run_folder import RunFolder
from debug_nan.app.run_options import RunOptions
from debug_nan.app.run_program import answer
from debug_nan.app.run_watch import Ending, Watch
from debug_nan.app.script_errors import blame, raised_by_us
from debug_nan.drivers.run.driver import RunDriver
from debug_nan.drivers.run.hooks import Hooks, RunStopped
from debug_nan.drivers.run.ranks import Ranks
from debug_nan.engine.session.unreplayed import InterruptedPinpoint
from debug_nan.errors import CommandRaised, InputError, describe_exception
from debug_nan.presentation.history_rows import Layout
from debug_nan.presentation.log import RankMarked, error_line
from debug_nan.presentation.report import build_report
from debug_nan.presentation.summary import exit_code
from debug_nan.process import interrupts

__all__ = ["Ending", "Watch", "finish", "run_command"]

MECHANISM = ("in place: the failing micro-batch replayed from the run's own state at that step, the script's code "
             "around the model from its record")


def run_command(command: commands.Command, options: RunOptions) -> int:
    """Run the Python command in this process, watched -> the exit code (1 a finding, 2 an error, else the command's
    own). Under torchrun every rank runs this; a rank leaves with its code once every rank is done (Ranks.leave: it
    never returns)."""
    ranks = Ranks.detect()
    if ranks is not None:
        ranks.report_fatal_signals()
    watch = Watch(options, command, ranks)
    watch.log(f"[debug-nan] run: {command.describe()} ({command.kind}; debug-nan's lines on stderr, the command's "
              f"output as it is)")
    folder = RunFolder().make()
    try:
        with folder.exported(options):
            ending = watch.run()
        children = folder.results()
        if children:  # processes it started trained (spawn's workers, Lightning's ranks): one answer of them all
            code, together = _with_children(watch, ending, children), ending.error is None
        else:
            code, together = finish(watch, ending)
    finally:
        folder.remove()
        watch.place_log()
    if watch.ranks is not None:
        watch.ranks.leave(code, together)
    return code


def _with_children(watch: Watch, ending: Ending, children: list[dict]) -> int:
    """The command's own processes trained too: this process's result (when it trained: Lightning's rank 0) joins
    theirs, and the one summary and report are made from them all (app/run_program.py)."""
    own, code = [], ending.code
    if ending.error is not None and watch.driver is None:  # (the spawning process's own error: as Python shows it)
        traceback.print_exception(ending.error, file=sys.stderr)
        code = 1
    if watch.driver is not None:
        log = watch.log
        log.stream, shown = io.StringIO(), log.stream
        code, _ = finish(watch, ending, write=False)
        log.stream = shown
        own = [result_of(watch, ending, code)]
    return answer(own + children, code, None, watch.command, watch.options, watch.log, watch.elapsed())


def finish(watch: Watch, ending: Ending, write: bool = True) -> tuple[int, bool]:
    """Settle the run from how it ended -> (the exit code, whether every rank ends at the same point: an agreed
    trip or stop, or a clean end). The last checks (an update the command ended after, a micro-batch it raised or
    gave up in), the summary and the report (with `write`: else kept in watch.outputs.result)."""
    hooks, log, options, ranks = watch.hooks, watch.log, watch.options, watch.ranks
    error, interrupted, code = ending.error, ending.interrupted, ending.code
    if hooks.failure is not None:
        raise hooks.failure
    if ending.stop == "max-steps":
        log(f"[debug-nan] --max-steps {options.max_steps}: the command was stopped after that many optimizer steps.")
    m = watch.driver
    if m is None and interrupted is not None:
        log(f"[debug-nan] interrupted ({interrupts.interrupt_name(interrupted)}) before any training step.")
        if ranks is None:  # the cli writes the report of a run interrupted before it trained
            raise interrupted
        return interrupts.interrupt_code(interrupted), False
    if m is None:
        if error is not None:
            said = blame(error, watch.prints_tracebacks, " before any training step (no forward of a model whose "
                         "parameters an optimizer owns, then backward, had run)") + "."
            raise (CommandRaised(said) if raised_by_us(error) is None else InputError(said))
        raise InputError(f"the command ended (exit {code}) without training: debug-nan run watches the model whose "
                         f"parameters a torch.optim optimizer owns, from its forward to its backward and optimizer "
                         f"step; this command created no optimizer, or never called that model's forward with "
                         f"gradients enabled.")
    if interrupted is not None:
        _keep_interrupted_finding(m, interrupted)
    # (an error of debug-nan's own is no trip)
    if error is not None and not m.stopped and hooks.state.open and raised_by_us(error) is None:
        try:
            m.raised(error)  # the micro-batch it raised in, replayed in place
        except KeyboardInterrupt as exc:
            interrupted = exc
            _keep_interrupted_finding(m, exc)
    elif not m.stopped and interrupted is None and error is None:
        _last_checks(m, hooks, code)
    if error is not None and not m.findings:
        said = blame(error, watch.prints_tracebacks, "; the watch saw no NaN/Inf before it, so this is an error in "
                     "the script, not a numerical one")
        log(error_line(said + "."), "red")
    m.close()
    if error is not None and m.error is None and not m.findings:
        where = raised_by_us(error)
        m.error = (describe_exception(error) if where is None
                   else f"debug-nan failed: {type(error).__name__}: {error} (at {where})")

    def final(result) -> int:  # the script's own code for a clean run
        return (interrupts.interrupt_code(interrupted) if interrupted is not None
                else code if result.status == "clean" else exit_code(result))

    integration = {"framework": "debug-nan run", "command": options.command, "kind": watch.command.kind,
                   "pinpoint": MECHANISM, "exit_code_of_command": code}
    if m.answer_seconds is not None:
        integration["pinpoint_seconds"] = round(m.answer_seconds, 4)  # from the tripping sync to the finding
    if ranks is not None:
        integration["world_size"] = ranks.world
    together = error is None and interrupted is None
    watch.integration = integration
    outputs = watch.outputs
    outputs.report = paths.destination(outputs.report, "--report", watch.script, log)
    outputs.plot = paths.destination(outputs.plot, "--plot", watch.script, log)
    if not watch.main_rank and not together and write:  # this rank ends alone: what it saw, its report.rankN.json
        log.stream = RankMarked(ranks.rank, log.stream.getvalue())
    result = outputs.conclude(m, m.s, integration, interrupted=interrupted is not None, exit_code=final,
                              write=write and (watch.main_rank or not together),
                              rank=ranks.rank if ranks is not None else 0, report_settings=options.report_settings())
    if not outputs.presented.ok:  # (a full disk): exit 2, as every entry point's unwritable output
        log(error_line(outputs.presented.why), "red")
        return 2, together
    return final(result), together


def result_of(watch: Watch, ending: Ending, code: int, error: str | None = None) -> dict:
    """This process's result, for the one answer of several (app/run_folder.py): its rank, how it ended, its
    report (from finish's result; `error`: the one-paragraph error where finish raised it)."""
    m, result = watch.driver, watch.outputs.result
    if result is not None:
        data = build_report(result, exit_code=code, settings=watch.options.report_settings(), device=m.device,
                            elapsed=watch.elapsed(), integration=watch.integration)
    else:
        data = {"status": "error", "steps_run": m.steps_run if m is not None else 0, "first_nonfinite": None,
                "findings": [], "error": error, "exit_code": code}
    ranks = watch.ranks
    return {"rank": ranks.rank if ranks is not None else None, "world": ranks.world if ranks is not None else 1,
            "pid": os.getpid(), "code": code, "report": data, "held": watch.held(),
            "layout": Layout.of(m.model).modules if m is not None else None,  # (the top's history table and plot)
            "ending": ending.stop or ("error" if ending.error is not None or error is not None else "ended")}


def _last_checks(m: RunDriver, hooks: Hooks, code: int) -> None:
    """The command ended on its own: a micro-batch it gave up in, its last update, then the final check."""
    if hooks.state.open:
        m.abandoned(code)
    try:
        if hooks.state.manual and hooks.state.backward_since_open and not m.stopped:
            hooks.close_manual_step()  # the last hand-written update
        if not m.stopped:
            hooks.flush_step()  # (several optimizers: their last step)
    except RunStopped:
        pass
    if not m.stopped:
        m.finish()


def _keep_interrupted_finding(m: RunDriver | None, exc: BaseException) -> None:
    """Ctrl-C / SIGTERM during the in-place replay: the trip the watch saw stands, without the op."""
    if m is not None and isinstance(exc, InterruptedPinpoint):
        m.findings.append(exc.finding)
        m.stopped = True
