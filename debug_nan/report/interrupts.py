"""Signals: SIGTERM (what `timeout`, SLURM and `docker stop` send) behaves like Ctrl-C, with its own exit code.

The handler raises KeyboardInterrupt("SIGTERM"), so every path that handles Ctrl-C (the loop's partial summary,
the runner's report) handles SIGTERM too; the exit code is 128 + the signal: 130 for Ctrl-C, 143 for SIGTERM.
No torch here (the cli installs it first thing).
"""

from __future__ import annotations

import signal
import threading

SIGTERM_NAME = "SIGTERM"
_received: list[int] = []


def _on_sigterm(signum, frame):  # noqa: ARG001 - the signal module's signature
    _received.append(signum)
    raise KeyboardInterrupt(SIGTERM_NAME)


def install() -> None:
    """Route SIGTERM through KeyboardInterrupt (main thread only, as the signal module requires)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _on_sigterm)


def is_sigterm(exc: BaseException | None = None) -> bool:
    """Was the interrupt (this one, or any so far) a SIGTERM?"""
    if exc is not None and exc.args[:1] == (SIGTERM_NAME,):
        return True
    return bool(_received)


def interrupt_code(exc: BaseException | None = None) -> int:
    return 128 + signal.SIGTERM if is_sigterm(exc) else 130


def interrupt_name(exc: BaseException | None = None) -> str:
    return "SIGTERM" if is_sigterm(exc) else "Ctrl-C"
