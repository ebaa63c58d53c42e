"""Signals: SIGTERM (what `timeout`, SLURM and `docker stop` send) behaves like Ctrl-C, with its own exit code.

The handler raises KeyboardInterrupt("SIGTERM"), so every path that handles Ctrl-C (the loop's partial summary,
the runner's report) handles SIGTERM too (in the user's own command under `debug-nan run`: `raising`); an
interrupt that lands inside an import waits for its end. The exit code is 128 + the signal: 130 for Ctrl-C, 143
for SIGTERM, 129 for a hang-up under torchrun (process/streams.py: a single process goes on after SIGHUP, as nohup
would). No torch here (the cli installs it first thing).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import sys
import threading

SIGTERM_NAME, SIGHUP_NAME = "SIGTERM", "SIGHUP"
NAMES = {signal.SIGTERM: SIGTERM_NAME, signal.SIGHUP: SIGHUP_NAME}
_received: list[int] = []


_stopping: list[int] = []  # interrupts so far in this command: the first stops the run, the rest are counted


_pending: list[int] = []  # a signal held back while a module is being imported (raised after it)
_deferring: list[bool] = []  # inside deferred(): held back whatever runs, raised when it ends
_raising: list = []  # inside raising(make): SIGTERM raises make(name) instead of KeyboardInterrupt


def on_signal(signum, frame):
    if _held(signum, frame) or _again(signum):
        return
    _received.append(signum)
    name = NAMES.get(signum, SIGTERM_NAME)
    raise _raising[-1](name) if _raising and signum == signal.SIGTERM else KeyboardInterrupt(name)


def _on_sigint(signum, frame):
    if not _held(signum, frame) and not _again(signum):
        raise KeyboardInterrupt


def _importing(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _held(signum: int, frame) -> bool:
    """An interrupt that lands inside an import (torch's, NumPy's: a half-imported module breaks every later
    import of it, a RecursionError in NumPy's) is held back and raised after it: at the end of deferred(), or by
    sending the signal again shortly (until no import is under way)."""
    if not _deferring and not _importing(frame):
        return False
    if not _pending:
        _pending.append(signum)
        if not _deferring:
            timer = threading.Timer(0.05, _resend, (signum,))
            timer.daemon = True
            timer.start()
    return True


def _resend(signum: int) -> None:
    _pending.clear()
    os.kill(os.getpid(), signum)


@contextlib.contextmanager
def deferred():
    """Around debug-nan's own imports of torch and the rest: an interrupt waits for them to end, then is raised
    here (KeyboardInterrupt, the signal's exit code), never from inside an import."""
    _deferring.append(True)
    try:
        yield
    finally:
        _deferring.pop()
    if _pending and not _deferring:
        signum = _pending.pop()
        if signum == signal.SIGINT:
            _on_sigint(signum, None)
        else:
            on_signal(signum, None)


@contextlib.contextmanager
def raising(make):
    """While the user's command runs under `debug-nan run`: SIGTERM raises make("SIGTERM") (not a KeyboardInterrupt,
    which the script's Ctrl-C branch would catch), still counted as the run's interrupt."""
    _raising.append(make)
    try:
        yield
    finally:
        _raising.pop()


def _again(signum: int) -> bool:
    """A second Ctrl-C / SIGTERM while the first is being handled (the summary and the report being written) says
    so instead of breaking that off (or printing a traceback from interpreter teardown); a third quits at once
    without them."""
    _stopping.append(signum)
    if len(_stopping) == 1:
        return False
    code = 128 + (_received[0] if _received else signal.SIGINT)
    if len(_stopping) >= 3:
        os._exit(code)
    try:
        sys.stderr.write("\ndebug-nan: stopping: writing the summary and the report (interrupt again to quit "
                         "without them).\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass
    return True


def install() -> None:
    """Route SIGTERM through KeyboardInterrupt, and a repeated interrupt through _again (main thread only, as the
    signal module requires)."""
    _stopping.clear()
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, _on_sigint)
        if not _at_exit:
            _at_exit.append(atexit.register(_ignore_at_exit))


_at_exit: list = []


def _ignore_at_exit() -> None:
    """The outputs are written and the process is ending: an interrupt during the interpreter's teardown (when
    Python puts the default handlers back) would only turn the code the run earned into death by signal."""
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        try:
            signal.signal(signum, signal.SIG_IGN)
        except (OSError, ValueError):
            pass


def _signal_of(exc: BaseException | None) -> int | None:
    """The signal of the interrupt (this one, or the first so far); None: Ctrl-C."""
    if exc is not None and exc.args[:1] and exc.args[0] in NAMES.values():
        return next(num for num, name in NAMES.items() if name == exc.args[0])
    return _received[0] if _received else None


def interrupt_code(exc: BaseException | None = None) -> int:
    num = _signal_of(exc)
    return 128 + int(num) if num is not None else 130


def interrupt_name(exc: BaseException | None = None) -> str:
    num = _signal_of(exc)
    return NAMES[num] if num is not None else "Ctrl-C"
