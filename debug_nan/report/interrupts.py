"""Signals: SIGTERM (what `timeout`, SLURM and `docker stop` send) behaves like Ctrl-C, with its own exit code.

The handler raises KeyboardInterrupt("SIGTERM"), so every path that handles Ctrl-C (the loop's partial summary,
the runner's report) handles SIGTERM too; the exit code is 128 + the signal: 130 for Ctrl-C, 143 for SIGTERM,
129 for a hang-up under torchrun (report/streams.py: a single process goes on after SIGHUP, as nohup would).
No torch here (the cli installs it first thing).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading

SIGTERM_NAME, SIGHUP_NAME = "SIGTERM", "SIGHUP"
NAMES = {signal.SIGTERM: SIGTERM_NAME, signal.SIGHUP: SIGHUP_NAME}
_received: list[int] = []


_stopping: list[int] = []  # interrupts so far in this command: the first stops the run, the rest are counted


def on_signal(signum, frame):  # noqa: ARG001 - the signal module's signature
    if _again(signum):
        return
    _received.append(signum)
    raise KeyboardInterrupt(NAMES.get(signum, SIGTERM_NAME))


def _on_sigint(signum, frame):  # noqa: ARG001
    if not _again(signum):
        raise KeyboardInterrupt


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
