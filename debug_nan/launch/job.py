"""`debug-nan run -- COMMAND`: the user's own training command, unmodified, watched from outside.

The command runs in this process (launch/command.py) with torch's global hooks (launch/hooks.py) driving the
framework step protocol (launch/watcher.py). debug-nan's own lines go to stderr (and --log), so the script's
stdout is byte for byte what it prints without debug-nan. On a trip the script is stopped and the command is
re-executed under the op-level tracer (launch/reexec.py); the summary and the JSON report follow, exit 1. A clean
run exits with the script's own code.
"""

from __future__ import annotations

import io
import os
import sys
import time
import traceback
from dataclasses import dataclass

import torch

from debug_nan.checks.finding import Finding, data_finding, watch_only_finding
from debug_nan.checks.vocabulary import adapt_advice
from debug_nan.errors import InputError, describe_exception
from debug_nan.frames import frame_kind, short_path
from debug_nan.integrations.outputs import Outputs, run_settings
from debug_nan.launch import command as commands
from debug_nan.launch.hooks import Hooks, RunStopped
from debug_nan.launch.ranks import Ranks, RanksUnanswered
from debug_nan.launch.reexec import deterministic_algorithms, reexecute, start_rng
from debug_nan.launch.watcher import RunMonitor
from debug_nan.report import interrupts
from debug_nan.report.log import Log, error_line
from debug_nan.report.summary import exit_code
from debug_nan.settings import RunSettings

MECHANISM = "re-execution of the command (same random state, losses compared bit for bit)"


@dataclass
class RunOptions:
    report: str | None = None
    log: str | None = None
    max_steps: int | None = None
    explosion_threshold: float = RunSettings.explosion_threshold  # the CLI's defaults
    explosion_growth: float = RunSettings.explosion_growth
    deterministic: bool = False  # torch.use_deterministic_algorithms in the run and its re-execution


class Watching:
    """The hooks' listener in the user's run: builds the RunMonitor when the root module is known."""

    def __init__(self, options: RunOptions, outputs: Outputs, log: Log, hooks: Hooks, ranks: Ranks | None = None):
        self.options, self.outputs, self.log, self.hooks, self.ranks = options, outputs, log, hooks, ranks
        self.monitor: RunMonitor | None = None

    def attach(self, model, optimizer) -> None:
        settings = run_settings(self.outputs, task=None, device=next(model.parameters()).device,
                                optimizer=optimizer, accumulation=1, precision="fp32", max_grad_norm=None,
                                max_steps=self.options.max_steps or 1, seed=0,
                                explosion_threshold=self.options.explosion_threshold,
                                explosion_growth=self.options.explosion_growth)
        try:
            ctx = self.ranks.adopt() if self.ranks is not None else None
        except InputError as exc:  # (raised from inside the script's forward: stopped as a BaseException)
            self.hooks.failure = exc
            raise RunStopped("error") from None
        self.monitor = RunMonitor(model, optimizer, settings, self.log, dist_ctx=ctx)
        count = sum(p.numel() for p in model.parameters())
        self.log(f"[debug-nan] watching {type(model).__name__} ({count:,} parameters) and its "
                 f"{type(optimizer).__name__}: a micro-batch is a backward call, a step an optimizer step")
        if ctx is not None:
            self.log(f"[debug-nan] torchrun: {ctx.world} ranks, each watched in its own process; they agree on "
                     f"every micro-batch's trip and stop together. Rank 0 prints debug-nan's lines and writes the "
                     f"report; a finding names the rank that saw the harm first.")

    def micro_begin(self, batch, step: int, micro: int) -> None:
        if self.options.max_steps and step > self.options.max_steps:
            raise RunStopped("max-steps")  # at the next forward: the script's own work after step N ran
        self.monitor.micro_begin(batch, step)

    def backward_begin(self, loss, step: int, micro: int) -> None:
        self.monitor.adopt_scaler(self.hooks.scaler)
        self.monitor.backward_begin(loss)

    def backward_end(self, step: int, micro: int) -> None:
        self.monitor.backward_end()

    def step_begin(self, step: int) -> None:
        pass

    def step_end(self, step: int, skipped: bool) -> None:
        self.monitor.step_end(skipped)


def _script_traceback(exc: BaseException) -> None:
    """The traceback as Python would print it for the script: from its own first frame on."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename.startswith(
            (os.path.dirname(commands.__file__), os.path.dirname(os.__file__))):
        tb = tb.tb_next
    traceback.print_exception(type(exc), exc, tb or exc.__traceback__, file=sys.stderr)


def _ours(exc: BaseException) -> str | None:
    """"debug_nan/x.py:N" when the script's error was raised in debug-nan's own code (its innermost frame outside
    the standard library and torch is debug-nan's, not the script's): debug-nan failed, not the script."""
    for frame in reversed(traceback.extract_tb(exc.__traceback__)):
        kind = frame_kind(frame.filename)
        if kind in ("torch", "plumbing") or frame.filename.startswith((os.path.dirname(os.__file__), "<frozen")):
            continue
        return f"{short_path(frame.filename)}:{frame.lineno}" if kind == "tool" else None
    return None


def _blame(exc: BaseException, clause: str) -> str:
    """The line that says whose error it is: the script's (its traceback as Python prints it) or debug-nan's own
    (the whole traceback, for a bug report)."""
    where = _ours(exc)
    if where is None:
        _script_traceback(exc)
        return f"the command raised {describe_exception(exc)}{clause}"
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    return (f"debug-nan itself failed inside the command ({type(exc).__name__}: {exc}, at {where}): a bug in "
            f"debug-nan, not an error in the script; please report it with the traceback above")


def run_command(words: list[str], options: RunOptions) -> int:
    """Run the command watched -> the exit code (1 a finding, 2 an error, else the script's own). Under torchrun
    every rank runs this; a rank leaves with its code once every rank is done (Ranks.leave: it never returns)."""
    ranks = Ranks.detect()
    code, together = _run_command(words, options, ranks)
    if ranks is not None:
        ranks.leave(code, together)
    return code


def _run_command(words: list[str], options: RunOptions, ranks: Ranks | None) -> tuple[int, bool]:
    """-> (the exit code, whether every rank ends at the same point: an agreed trip or stop, or a clean end)."""
    command = commands.resolve(words)
    main_rank = ranks is None or ranks.is_main
    outputs = Outputs(options.report, None, False, options.log if main_rank else None, "stop")
    # another rank's lines are held back: shown (marked with its rank) only if it ends alone
    log = outputs.log = Log(options.log, stream=sys.stderr) if main_rank else Log(None, stream=io.StringIO())
    outputs.open()
    log(f"[debug-nan] run: {command.describe()} ({command.kind}; debug-nan's lines on stderr, the command's "
        f"output as it is)")
    hooks = Hooks(None)
    watching = Watching(options, outputs, log, hooks, ranks)
    hooks.listener = watching
    rng, cwd, started = start_rng(), os.getcwd(), time.monotonic()
    code, error, interrupted = 0, None, None
    hooks.install()
    was_deterministic = deterministic_algorithms(options.deterministic)
    try:
        code = commands.run(command)
    except RunStopped as stop:
        if stop.reason == "max-steps":
            log(f"[debug-nan] --max-steps {options.max_steps}: the command was stopped after that many optimizer "
                f"steps.")
    except KeyboardInterrupt as exc:
        interrupted = exc
    except Exception as exc:  # noqa: BLE001 - the script's own failure: a trip when the watch sees harm behind it
        error = exc
    finally:
        hooks.uninstall()
        torch.use_deterministic_algorithms(was_deterministic)
    if hooks.failure is not None:
        raise hooks.failure
    m = watching.monitor
    if m is None and interrupted is not None:
        log(f"[debug-nan] interrupted ({interrupts.interrupt_name(interrupted)}) before any training step.")
        return interrupts.interrupt_code(interrupted), False
    if m is None:
        if error is not None:
            raise InputError(_blame(error, " before any training step (no forward of a model whose "
                                    "parameters an optimizer owns, then backward, had run)") + ".")
        raise InputError(f"the command ended (exit {code}) without training: debug-nan run watches the model whose "
                         f"parameters a torch.optim optimizer owns, from its forward to its backward and optimizer "
                         f"step; this command created no optimizer, or never called that model's forward with "
                         f"gradients enabled.")
    if error is not None and not m.stopped and hooks.open and _ours(error) is None:  # (debug-nan's own: no trip)
        m.end(last=False, error=error)
    elif not m.stopped and interrupted is None and error is None:
        m.finish()
    if m.pending is not None:
        timeout_s = 120.0 + 3 * (time.monotonic() - started)  # the re-executed ranks' limit: never a hang
        interrupted = _pinpoint(m, words, cwd, rng, log, options.deterministic, ranks, timeout_s) or interrupted
    if error is not None and not m.findings:
        said = _blame(error, "; the watch saw no NaN/Inf before it, so this is an error in the script, not "
                           "a numerical one")
        log(error_line(said + "."), "red")
    m.close()
    if error is not None and m.error is None and not m.findings:
        where = _ours(error)
        m.error = (describe_exception(error) if where is None
                   else f"debug-nan failed: {type(error).__name__}: {error} (at {where})")
    settings = m.s
    settings.max_steps = max(1, m.steps_run)

    def final(result) -> int:  # the script's own code for a clean run
        return (interrupts.interrupt_code(interrupted) if interrupted is not None
                else code if result.status == "clean" else exit_code(result))

    integration = {"framework": "debug-nan run", "command": words, "kind": command.kind, "pinpoint": MECHANISM,
                   "exit_code_of_command": code}
    if ranks is not None:
        integration["world_size"] = ranks.world
    together = error is None and interrupted is None and (m.pending is None or m.pending.first_ranks is not None)
    if not main_rank and not together:  # this rank ends alone: what it saw, and its own report (report.rankN.json)
        log.stream = _RankMarked(ranks.rank, log.stream.getvalue())
    result = outputs.conclude(m, settings, integration, interrupted=interrupted is not None, exit_code=final,
                              write=main_rank or not together, rank=ranks.rank if ranks is not None else 0)
    return final(result), together


class _RankMarked:
    """stderr for another rank's log lines, each marked with the rank (`held`: its lines so far)."""

    def __init__(self, rank: int, held: str):
        self.prefix = f"[rank {rank}] "
        self.write(held)

    def write(self, text: str) -> None:
        sys.stderr.write("".join(self.prefix + line for line in text.splitlines(keepends=True)))

    def flush(self) -> None:
        sys.stderr.flush()


def _pinpoint(m: RunMonitor, words: list[str], cwd: str, rng: dict, log: Log, deterministic: bool,
              ranks: Ranks | None = None, timeout_s: float | None = None) -> KeyboardInterrupt | None:
    """The trip's finding, by re-executing the command under the tracer (under torchrun: every rank at once, and
    the finding is the first rank's whose re-execution named the op). Returns the interrupt that stopped the
    re-execution, if any (the watch's finding then stands, without the op)."""
    trip = m.pending
    check = trip.check
    where = f"step {trip.step}, micro-batch {trip.micro}"
    seen = (f"{check.kind} check of `{check.name or '<loss>'}` read {check.value}" if check is not None
            else f"the command raised {describe_exception(trip.error)}" if trip.error is not None else "")
    alone = ranks is not None and trip.first_ranks is None  # the script raised on this rank: not agreed on
    if alone:
        seen = f"on rank {ranks.rank} alone, {seen}"
    elif ranks is not None:
        seen = (f"rank(s) {trip.first_ranks} saw it first (phase {trip.phase}); rank {ranks.rank}: "
                f"{seen or 'nothing non-finite of its own'}")
    log(f"  [watch] TRIP at {where}: {seen}", "red")
    lines: list[tuple[str, str | None]] = []  # what the pinpoint says, from the rank whose finding is reported
    say = (lambda text, colour=None: lines.append((text, colour)))
    interrupted, finding, error = None, None, None
    if trip.phase == "data" or trip.phase is None and check is not None and check.kind == "data":
        if check is not None and check.kind == "data":
            finding = data_finding(trip.step, trip.micro, trip.batch, check)
    elif alone:  # the others may wait in a collective (torchrun ends them once this rank exits)
        finding, error = _answer_finding(m, trip, {"missing": (
            "the script raised on this rank alone, and a DDP script cannot be re-executed on one rank (its "
            "collectives would wait for the others): no op is named")}, say, True)
    else:
        phase = "its optimizer step" if trip.optimizer else "forward, loss, backward"
        log(f"  [pinpoint] mechanism: {MECHANISM}. Re-running the command{' on every rank' if ranks else ''} "
            f"with the op-level tracer on at {where} ({phase})...")
        trace = ranks is None or ranks.rank in trip.first_ranks
        try:
            answer = reexecute(words, cwd, trip, m.history.losses, rng, deterministic, ranks, trace, timeout_s)
        except KeyboardInterrupt as exc:  # Ctrl-C / SIGTERM: the trip the watch saw still stands
            interrupted = exc
            answer = {"missing": f"the re-execution was interrupted ({interrupts.interrupt_name(exc)}) before "
                                 f"it named the op"}
        finding, error = _answer_finding(m, trip, answer, say, trace)
    if ranks is not None and trip.first_ranks is not None:
        try:  # (another rank's re-execution may run up to its own limit after this one's ended)
            finding, error, lines = ranks.agree_on_finding(trip.first_ranks, finding, error, lines,
                                                           (timeout_s or 0.0) + 60.0)
        except RanksUnanswered as exc:  # this rank's own pinpoint stands, said so
            lines.append((f"  [ddp] {exc}: this rank's own pinpoint is reported", "yellow"))
            if finding is not None:
                finding.rank, finding.first_ranks = ranks.rank, trip.first_ranks
    elif ranks is not None and finding is not None:
        finding.rank, finding.first_ranks = ranks.rank, [ranks.rank]
    for text, colour in lines:
        log(text, colour)
    if error is not None:
        m.error = error
    if finding is not None:
        m.findings.append(adapt_advice(finding, m.dialect))  # the advice in a script author's words, not flags
    return interrupted


def _answer_finding(m: RunMonitor, trip, answer: dict, say, trace: bool) -> tuple[Finding | None, str | None]:
    """The re-execution's answer -> (the finding, or the error that stands instead), what it says in `say`."""
    check = trip.check
    if "finding" in answer:
        say(f"  [pinpoint] {answer['ops']} ops traced, {answer['origins']} non-finite origin(s); the earliest in "
            f"the lineage of the harmed value is the finding.")
        return Finding(**answer["finding"]), None
    if "error" in answer:
        say(f"  [pinpoint] {answer['error']}", "yellow")
        return None, answer["error"]
    if not trace and "diverged" not in answer and "missing" not in answer:
        return None, None  # under torchrun, a rank that only took part in the collectives
    why = answer.get("diverged") or answer.get("missing")
    if "diverged" in answer:
        why = (f"the command is not deterministic: {why}. So the re-execution is not the run, and its origin "
               f"would not be this run's: only the watch's finding is reported. Seed everything (torch, "
               f"numpy, random, the data order) and set PYTHONHASHSEED to have the op named; on a GPU, add "
               f"--deterministic (torch.use_deterministic_algorithms in both runs).")
    say(f"  [pinpoint] {why}", "yellow")
    if check is not None:
        return watch_only_finding(trip.step, trip.micro, trip.batch, check, m.model, why=why), None
    return None, describe_exception(trip.error) if trip.error is not None else None
