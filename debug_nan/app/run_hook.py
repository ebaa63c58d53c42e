"""The watch in a process of `debug-nan run -- PROGRAM` that trains: the start-up hook (process/startup_hook.py)
calls `attach()` at the process's first optimizer, whatever started it (torchrun, a shell script, Lightning's
launcher, `torch.multiprocessing.spawn`).

The process is watched as under `torchrun -m debug_nan run` (app/run_watch.py's Watch, run_job.py's finish, the ranks'
agreement over the script's own process group, its rank and world learned from that group). Where it ends, it
leaves its result in the run's private folder (app/run_folder.py) for the top debug-nan process, which prints the
one summary and writes the one report after the command ended:
  * a stop (a trip, --max-steps) ends the process where it is decided, as every rank decides it together: the
    result, then Ranks.leave (the ranks leave together, with the code);
  * the script's own exception that nothing caught (sys.excepthook): its micro-batch replayed where the watch saw
    harm behind it, the result, then Python's own traceback and exit;
  * any other end (atexit): the last update's check, each rank alone (its parameters are replicas, and another
    rank may be gone), and the result.
Rank 0's debug-nan lines go to stderr as they come; another rank's are kept in its result (the top shows them, marked
with the rank, when that rank ended alone).
"""

from __future__ import annotations

import atexit
import io
import os
import signal
import sys
import threading

from debug_nan.app import run_folder, run_fork, script_errors
from debug_nan.app import command as commands
from debug_nan.app.command import Command
from debug_nan.app.run_job import finish, result_of
from debug_nan.app.run_options import RunOptions
from debug_nan.app.run_watch import Ending, Watch
from debug_nan.drivers.run.ranks import Ranks
from debug_nan.drivers.run.stops import RunStopped
from debug_nan.errors import InputError
from debug_nan.presentation.log import Log
from debug_nan.process import interrupts



def attach() -> None:
    """At the process's first optimizer: the watch's hooks installed (the optimizer being created is the first
    they see)."""
    folder = run_folder.this_run()
    if folder is None or run_fork.attached:
        return
    given = run_folder.options_of_this_run()
    options = RunOptions(**{**given, "report": None, "log": None, "plot": None, "tensorboard": None,  # (the top's)
                            "trace_at": tuple(given["trace_at"]) if given.get("trace_at") else None})
    watch = HookedWatch(options, folder)
    run_fork.attached.append(watch)
    watch.hooks.install()
    run_fork.watching(watch)
    atexit.register(watch.at_exit)
    if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, watch.terminated)  # (the script's own handler, where it has one, stays)
    sys.excepthook = watch.excepthook
    sys.exit = watch.exit


def _this_process() -> Command:
    argv = list(sys.argv)
    script = os.path.abspath(argv[0]) if argv and os.path.isfile(argv[0]) else ""
    return Command("script" if script else "process", script, argv, list(getattr(sys, "orig_argv", argv)))


class HookedWatch(Watch):
    prints_tracebacks = False  # (Python's excepthook prints the script's: self.excepthook)

    def __init__(self, options: RunOptions, folder: run_folder.RunFolder):
        super().__init__(options, _this_process(), Ranks.detect(), log=Log(None, stream=io.StringIO()),
                         on_stop=self._stopped)
        # the code this process exits with, where it is seen here: sys.exit in the main thread, a forked worker's
        # os._exit (app/run_fork.py); None: none seen (the script ran to its end, or raised SystemExit itself)
        self.folder, self.ended, self.exit_code = folder, False, None
        self._excepthook = sys.excepthook

    def attach(self, model, optimizer) -> None:
        super().attach(model, optimizer)
        if self.main_rank:  # rank 0 (or the one process): its lines on stderr as they come
            sys.stderr.write(self.held())
            self.log.stream = sys.stderr

    # -- how it ends -------------------------------------------------------------------------------------------
    def _stopped(self, stop: RunStopped) -> None:
        code, together = self.end(Ending(stop=stop.reason if stop.reason != "error" else None))
        if self.ranks is not None:
            self.ranks.leave(code, together)  # (never returns)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def excepthook(self, kind, value, traceback) -> None:
        if isinstance(value, Exception):
            self.end(Ending(code=1, error=value))
        elif isinstance(value, KeyboardInterrupt):  # (Ctrl-C, which reached the whole command)
            self.alone()
            self.end(Ending(interrupted=value))
        # (the traceback python prints without debug-nan: not the frames of its recorder, through which the
        # script's torch calls went)
        self._excepthook(kind, value, script_errors.as_python_shows(value))

    def terminated(self, signum, frame) -> None:
        """SIGTERM, where the script left it to Python's default: the result (interrupted) is left, then the
        process dies by SIGTERM as it does without debug-nan."""
        signal.signal(signum, signal.SIG_DFL)
        try:
            self.alone()
            self.end(Ending(interrupted=KeyboardInterrupt(interrupts.SIGTERM_NAME)))
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.kill(os.getpid(), signum)

    def exit(self, status=None):
        """sys.exit as the script calls it: its code kept for the result (an atexit function cannot read it). In
        another thread it ends that thread only: not the process's code. A SystemExit the script raises itself
        (`raise SystemExit(main())`, the builtin exit()) leaves no trace a process can read on Python 3.10-3.11
        without tracing every call: its code is the launcher's word (torchrun's), else said to be unseen; os._exit
        runs no Python at all."""
        if threading.current_thread() is threading.main_thread():
            self.exit_code = commands.exit_code(status) if isinstance(status, (int, type(None))) else 1
        raise SystemExit(status)

    def alone(self) -> None:
        """From here each rank settles alone: another may be gone, no collective now."""
        if self.driver is not None and self.driver.session.p.agreement is not None:
            self.driver.session.p.agreement = None

    def at_exit(self) -> None:
        self.alone()
        code, together = self.end(Ending(code=self.exit_code or 0), seen=self.exit_code is not None)
        if self.ranks is not None and together:
            self.ranks.meet(code, timeout_s=30.0)  # (as a rank run in its launcher's process leaves: together)

    def end(self, ending: Ending, seen: bool = True) -> tuple[int, bool]:
        """The run settled from `ending`, its result left in the run folder -> (exit code, together). `seen`:
        whether the process saw how it exits (else its code is 0 as far as it knows: `code_seen` false)."""
        if self.ended:
            return 1, False
        self.ended = True
        self.hooks.uninstall()
        if self.driver is None and self.hooks.failure is None:
            return ending.code, False  # an optimizer, but no training: nothing to say
        held, error = self.held(), None
        self.log.stream = io.StringIO()  # (the summary is the top process's: one, after the command ended)
        try:
            code, together = finish(self, ending, write=False)
        except InputError as exc:
            code, together, error = exc.exit_code, False, str(exc)
        self.folder.write_result({**result_of(self, ending, code, error), "held": held, "node_ranks": _node_ranks(),
                                  "code_seen": seen})
        return code, together


def _node_ranks() -> list[int] | None:
    """The global ranks of this process's torchrun node (RANK - LOCAL_RANK, then LOCAL_WORLD_SIZE of them), where
    torchrun said; else None."""
    try:
        rank, local, count = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))
    except (KeyError, ValueError):
        return None
    return list(range(rank - local, rank - local + count))


__all__ = ["attach"]
