"""Signals: SIGTERM (what `timeout`, SLURM and `docker stop` send) behaves like Ctrl-C, with its own exit code.

The handler raises KeyboardInterrupt("SIGTERM"), so every path that handles Ctrl-C (the loop's partial summary,
the runner's report) handles SIGTERM too; the exit code is 128 + the signal: 130 for Ctrl-C, 143 for SIGTERM,
129 for a hang-up under torchrun (report/streams.py: a single process goes on after SIGHUP, as nohup would).
No torch here (the cli installs it first thing).
"""

from __future__ import annotations

import signal
import threading

SIGTERM_NAME, SIGHUP_NAME = "SIGTERM", "SIGHUP"
NAMES = {signal.SIGTERM: SIGTERM_NAME, signal.SIGHUP: SIGHUP_NAME}
_received: list[int] = []


def on_signal(signum, frame):  # noqa: ARG001 - the signal module's signature
    _received.append(signum)
    raise KeyboardInterrupt(NAMES.get(signum, SIGTERM_NAME))


def install() -> None:
    """Route SIGTERM through KeyboardInterrupt (main thread only, as the signal module requires)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, on_signal)


def _signal_of(exc: BaseException | None) -> int | None:
    """The signal of the interrupt (this one, or the first so far); None: Ctrl-C."""
    if exc is not None and exc.args[:1] and exc.args[0] in NAMES.values():
        return next(num for num, name in NAMES.items() if name == exc.args[0])
    return _received[0] if _received else None


def is_sigterm(exc: BaseException | None = None) -> bool:
    """Was the interrupt (this one, or any so far) a signal (SIGTERM, or SIGHUP under torchrun) rather than Ctrl-C?"""
    return _signal_of(exc) is not None


def interrupt_code(exc: BaseException | None = None) -> int:
    num = _signal_of(exc)
    return 128 + int(num) if num is not None else 130


def interrupt_name(exc: BaseException | None = None) -> str:
    num = _signal_of(exc)
    return NAMES[num] if num is not None else "Ctrl-C"
