"""The standard streams never end a run, and never cost its exit code: a terminal that hangs up (SIGHUP: the SSH
session drops), a pipe whose reader went away (`| head`, a `| tee` killed with the session), a full disk
(`> /dev/full`) or a stream closed before the start (`>&-`, `2>&-`). The outputs that matter are the JSON report,
the --log copy and the bundle; stdout and stderr are a view of them.

`install()` (the cli, first thing): file descriptors 0-2 that are closed get /dev/null (so no output file opened
later can become fd 1 and receive the log), sys.stdout / sys.stderr are wrapped so that a failing write or flush
sends the rest of that stream to /dev/null (the file descriptor too: what Python flushes at exit, or C code
writes, goes nowhere) and is recorded once, and SIGHUP is handled as nohup would: the run goes on, a terminal's
streams go to /dev/null. Under torchrun a hang-up stops the run like SIGTERM (torchrun forwards it to every worker
and kills them after a grace period, so the run could not go on): process/interrupts.py. No torch here.
"""

from __future__ import annotations

import io
import os
import signal
import sys
import threading

from debug_nan.process import interrupts

NAMES = {1: "stdout", 2: "stderr"}
_failures: dict[str, str] = {}  # "stdout" / "stderr" -> why it stopped
_hangups: list[int] = []  # SIGHUPs received
_terminal_fds: set[int] = set()  # which of fds 1-2 were a terminal at the start (a hung-up tty is no tty any more)


def _devnull_onto(fd: int) -> None:
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, fd)
    finally:
        os.close(null)


def record(name: str, why: str) -> None:
    _failures.setdefault(name, why)


def failure(name: str) -> str | None:
    """Why stdout or stderr stopped (None: it did not)."""
    return _failures.get(name)


def hung_up() -> bool:
    return bool(_hangups)


class GuardedStream:
    """A text stream (sys.stdout / sys.stderr) whose failing write or flush is recorded once and switches it to
    /dev/null; everything else (encoding, isatty, fileno, ...) is the wrapped stream's."""

    def __init__(self, stream, name: str):
        self._stream, self._name = stream, name

    def write(self, text):
        try:
            return self._stream.write(text)
        except (OSError, ValueError) as exc:  # EPIPE, EIO (hung-up tty), ENOSPC, a closed file; not TypeError
            self._failed(exc)
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except (OSError, ValueError) as exc:
            self._failed(exc)

    def _failed(self, exc: Exception) -> None:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc) or type(exc).__name__
        record(self._name, reason)
        try:
            _devnull_onto(self._stream.fileno())  # the bytes still buffered, and Python's flush at exit, go nowhere
            self._stream.flush()
        except (OSError, ValueError):
            self._stream = open(os.devnull, "w")

    def __getattr__(self, name):
        return getattr(self._stream, name)


def _reopen_closed_fds() -> None:
    """A closed fd 0-2 gets /dev/null (os.open takes the lowest free fd: the closed one), and Python's missing
    sys.stdout / sys.stderr (None when the fd was closed at start) a stream on it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            opened = os.open(os.devnull, os.O_RDWR)
            if opened != fd:  # cannot happen with lower fds open; never keep a stray descriptor
                os.close(opened)
                continue
            if fd in NAMES:
                record(NAMES[fd], "closed when debug-nan started")
    for fd, name in NAMES.items():
        if getattr(sys, name) is None:
            setattr(sys, name, io.TextIOWrapper(open(fd, "wb", closefd=False), line_buffering=True))


def _on_hangup(signum, frame) -> None:  # the signal module's signature
    """The terminal went away: keep running (as nohup would) with the terminal's streams on /dev/null."""
    _hangups.append(signum)
    for fd in sorted(_terminal_fds):
        try:
            _devnull_onto(fd)
        except OSError:
            pass
        record(NAMES[fd], interrupts.SIGHUP_NAME)
    if "RANK" in os.environ:  # torchrun forwards the hang-up to its workers, then kills them: stop like SIGTERM
        interrupts.on_signal(signum, frame)


def install() -> None:
    """Guard the standard streams and handle SIGHUP (signals: main thread only, as the signal module requires)."""
    _failures.clear()  # a new command (the tests run several in one process)
    _hangups.clear()
    _reopen_closed_fds()
    for fd, name in NAMES.items():
        stream = getattr(sys, name)
        try:
            if os.isatty(fd):
                _terminal_fds.add(fd)
        except OSError:
            pass
        if not isinstance(stream, GuardedStream):
            setattr(sys, name, GuardedStream(stream, name))
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGHUP, _on_hangup)


def notes() -> list[str]:
    """What the report says about the streams: where the rest of the log went."""
    out = []
    if hung_up() and "RANK" not in os.environ:
        out.append("The terminal hung up (SIGHUP) during the run; it went on as under nohup: the rest of the log "
                   "went to --log and the report only.")
    if failure("stdout") and failure("stdout") != interrupts.SIGHUP_NAME:
        out.append(f"stdout was closed or failed ({failure('stdout')}): the rest of the log went to --log and the "
                   f"report only.")
    if failure("stderr") and failure("stderr") != interrupts.SIGHUP_NAME:
        out.append(f"stderr was closed or failed ({failure('stderr')}): warnings and errors are in the report "
                   f"and --log only.")
    return out
