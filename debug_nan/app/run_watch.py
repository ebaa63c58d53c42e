"""The watch of one `debug-nan run` process: `Watch` is the hooks' listener (drivers/run/hooks.py Listener), which
builds the RunDriver at the first training forward and hands it the hooks' events; `Watch.run` runs a Python
command in this process and returns its `Ending`, the value app/run_job.py's `finish` settles the run from.
"""

from __future__ import annotations

import io
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Callable

import torch

from debug_nan.app import command as commands
from debug_nan.app import run_fork
from debug_nan.app import run_paths as paths
from debug_nan.app.run_options import RunOptions
from debug_nan.drivers.framework_outputs import Outputs
from debug_nan.drivers.run.driver import RunDriver
from debug_nan.drivers.run.ensemble import Models, Optimizers, parameter_count
from debug_nan.drivers.run.hooks import Hooks, RunStopped
from debug_nan.drivers.run.ranks import Ranks
from debug_nan.engine.sharded import user_class
from debug_nan.errors import InputError
from debug_nan.presentation.log import Log
from debug_nan.process import interrupts


@dataclass
class Ending:
    """How the watched command ended: the value the run is finished from (`finish`)."""

    code: int = 0  # the command's own exit code (SystemExit's, as Python maps it)
    stop: str | None = None  # debug-nan stopped it: "trip" | "max-steps"
    error: Exception | None = None  # the script's own exception, out of the command
    interrupted: BaseException | None = None  # Ctrl-C, or SIGTERM (KeyboardInterrupt("SIGTERM"))


class Watch:
    """The hooks' listener (drivers/run/hooks.py Listener) in the user's run: the RunDriver, built at the first
    training forward, with the run's outputs and log. A stop decided inside a hook (RunStopped) goes to `on_stop`:
    raised out of the script when it runs in this process, the process's own end where the hook attached."""

    # the script's traceback is printed here (a script run in this process); where the hook attached, Python's own
    # excepthook prints it (app/run_hook.py), so the summary only names the error
    prints_tracebacks = True

    def __init__(self, options: RunOptions, command: commands.Command, ranks: Ranks | None = None,
                 log: Log | None = None, on_stop: Callable[[RunStopped], None] | None = None):
        self.options, self.command, self.ranks = options, command, ranks
        self.hooks = Hooks(self)
        self.driver: RunDriver | None = None
        self.on_stop = on_stop or _raise
        self.outputs = Outputs(options.report, None, False, options.log if self.main_rank else None, "stop",
                               options.plot, options.tensorboard, options.history)
        # another rank's lines are held back: shown (marked with its rank) only if it ends alone
        self.log = self.outputs.log = log or (Log(paths.partial(options.log), follow_stderr=True) if self.main_rank
                                              else Log(None, stream=io.StringIO()))
        self.outputs.open()
        self.integration: dict = {}  # the report's `integration` (finish)
        self.started = time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def held(self) -> str:
        """The lines of a rank whose log is held back (shown only if it ends alone)."""
        stream = self.log.stream
        return stream.getvalue() if isinstance(stream, io.StringIO) else ""

    @property
    def main_rank(self) -> bool:
        return self.ranks is None or self.ranks.is_main

    @property
    def script(self) -> str | None:
        """The script's path (an output never lands on it)."""
        return self.command.target if self.command.kind == "script" else None

    # -- the command, in this process --------------------------------------------------------------------------
    def run(self) -> Ending:
        """Run the command here with the hooks installed -> how it ended."""
        self.hooks.install()
        run_fork.watching(self)
        was_deterministic = deterministic_algorithms(self.options.deterministic)
        paths.record_opens(True)  # an output path the command opens is not written over (paths.py)
        try:
            with interrupts.raising(RunStopped):  # SIGTERM ends the script as it ends a plain run: no Ctrl-C branch
                return Ending(code=commands.run(self.command))
        except RunStopped as stop:
            if stop.reason == interrupts.SIGTERM_NAME:
                return Ending(interrupted=KeyboardInterrupt(stop.reason))
            return Ending(stop=stop.reason)
        except KeyboardInterrupt as exc:
            return Ending(interrupted=exc)
        except Exception as exc:  # noqa: BLE001 - the script's own failure: a trip when the watch sees harm behind it
            return Ending(error=exc)
        finally:
            paths.record_opens(False)
            run_fork.done(self)
            self.hooks.uninstall()
            torch.use_deterministic_algorithms(was_deterministic)

    @contextmanager
    def stops(self):
        """Around every event: a stop decided inside it goes to on_stop."""
        try:
            yield
        except RunStopped as stop:
            self.on_stop(stop)

    # -- the hooks' events -------------------------------------------------------------------------------------
    def attach(self, model, optimizer) -> None:
        options = self.options
        settings = options.settings()
        try:
            ctx = self.ranks.adopt() if self.ranks is not None else self._join_ranks()
        except InputError as exc:  # (raised from inside the script's forward: stopped as a BaseException)
            self.hooks.failure = exc
            with self.stops():
                raise RunStopped("error") from None
        self.driver = RunDriver(model, optimizer, settings, self.log, self.hooks, dist_ctx=ctx,
                                bundle_dir=options.bundle_dir, shown_from=options.start_dir,
                                trace_at=options.trace_at, command=options.command)
        self.log(_watching_line(model, optimizer))
        if ctx is not None:
            launcher = "torchrun: " if "TORCHELASTIC_RUN_ID" in os.environ else ""
            self.log(f"[debug-nan] {launcher}{ctx.world} ranks, each watched in its own process; they agree on every "
                     f"micro-batch's trip and stop together. Rank 0 prints debug-nan's lines and writes the report; "
                     f"a finding names the rank that saw the harm first.")

    def _join_ranks(self):
        """No RANK in the environment (torch.multiprocessing.spawn's workers, Lightning's): the process group the
        script created says this process's rank and world."""
        self.ranks = Ranks.of_group()
        if self.ranks is None:
            return None
        if not self.ranks.is_main:
            self.log.stream = io.StringIO()  # (held back: this rank's lines show only if it ends alone)
            self.outputs.log_path = None
        return self.ranks.adopt()

    def eval_begin(self, module, args: tuple, kwargs: dict, steps_taken: int) -> None:
        with self.stops():
            if self.driver is not None and not self.driver.stopped and \
                    self.driver.eval_begin(module, args, kwargs, steps_taken):
                raise RunStopped("trip")

    def eval_end(self, output) -> None:
        with self.stops():
            if self.driver is not None and not self.driver.stopped and self.driver.eval_end(output):
                raise RunStopped("trip")

    def micro_begin(self, batch, step: int, micro: int) -> None:
        with self.stops():
            if self.options.max_steps and step > self.options.max_steps:
                raise RunStopped("max-steps")  # at the next forward: the script's own work after step N ran
            self.driver.micro_begin(batch, step)

    def backward_begin(self, loss, step: int, micro: int, tape) -> None:
        self.driver.adopt_scaler(self.hooks.state.scaler)
        self.driver.backward_begin(loss, tape)

    def backward_end(self, step: int, micro: int) -> None:
        with self.stops():
            self.driver.backward_end()

    def step_begin(self, step: int, update) -> None:
        self.driver.step_begin(update)

    def step_end(self, step: int, skipped: bool) -> None:
        with self.stops():
            self.driver.step_end(skipped)

    def forwards_given_up(self, tape, calls: list[int], outputs: list) -> None:
        with self.stops():
            self.driver.forwards_given_up(tape, calls, outputs)
            if self.driver.stopped:
                raise RunStopped("trip")

    def follow(self, optimizer) -> None:
        self.log(f"[debug-nan] the script replaced its optimizer with a new {type(optimizer).__name__} (a new "
                 f"training stage): watching that one from step {self.driver.session.steps}")
        self.driver.follow(optimizer, self.hooks.scheduler_of(optimizer))

    def training_ends(self) -> None:
        """The script destroys its process group: the last update is checked now, agreed on by the ranks."""
        with self.stops():
            if self.driver is not None and not self.driver.stopped:
                self.driver.finish()
                if self.driver.findings:
                    raise RunStopped("trip")

    def place_log(self) -> None:
        """The --log copy, streamed beside its path, moved there (or beside it, when the command used that file)."""
        if self.log.copy_path is None:
            return
        self.log.close()
        notes: list[str] = []
        paths.place(self.log.copy_path, self.options.log, "--log", self.script, notes.append)
        self.log.copy_path = None
        for line in notes:
            self.log(line, "yellow")


def _raise(stop: RunStopped) -> None:
    raise stop


def _watching_line(model, optimizer) -> str:
    count = parameter_count(model, optimizer)  # (the optimizers' parameters; an EMA copy named apart)
    if isinstance(optimizer, Optimizers):
        optimizers = ", ".join(optimizer.describe(i) for i in range(len(optimizer.members)))
        named = model.describe() if isinstance(model, Models) else user_class(type(model)).__name__
        return (f"[debug-nan] watching {named} ({count}) and "
                f"{'their optimizers' if len(optimizer.members) > 1 else 'its optimizer'} {optimizers}: a "
                f"micro-batch is a backward call, a step an optimizer step (those that step together, with no "
                f"forward between them, one step)")
    if optimizer is None:
        return (f"[debug-nan] watching {user_class(type(model)).__name__} ({count}), whose weights the "
                f"script updates itself (no torch.optim optimizer): a micro-batch is a backward call, a step ends at "
                f"the next forward, where its update is checked")
    return (f"[debug-nan] watching {user_class(type(model)).__name__} ({count}) and its "
            f"{type(optimizer).__name__}: a micro-batch is a backward call, a step an optimizer step")


def deterministic_algorithms(on: bool) -> bool:
    """--deterministic: torch.use_deterministic_algorithms (warn only where an op has no deterministic kernel),
    with cuBLAS's workspace setting it needs. Returns the setting before."""
    before = torch.are_deterministic_algorithms_enabled()
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    return before
