"""The text log: stdout, line-buffered and tee-friendly, plus an optional copy (--log PATH).

Colour only on a TTY and never when NO_COLOR is set; progress bars go to stderr elsewhere. The log never stops a
run: when stdout closes (`| head`) the rest goes to /dev/null (the copy and the report still get everything), and
when the copy cannot be written (disk full, /dev/full) that is said once on stderr and the copy stops.
"""

from __future__ import annotations

import os
import sys
from contextlib import contextmanager
from pathlib import Path

from debug_nan.errors import InputError
from debug_nan.presentation.line_width import fit, log_width
from debug_nan.process import streams

COLOURS = {"red": "31", "green": "32", "yellow": "33", "bold": "1", "dim": "2"}


def error_line(message: str) -> str:
    """How an exit-2 error reads, on stderr (printed by the cli) and in the log copy."""
    return f"debug-nan: error: {message}"


class Log:
    def __init__(self, copy_path: str | None = None, stream=None, follow_stderr: bool = False):
        self._follows_stderr = follow_stderr  # (see `stream`)
        self._stream = sys.stderr if follow_stderr else stream or sys.stdout
        self.colour = (hasattr(self.stream, "isatty") and self.stream.isatty() and "NO_COLOR" not in os.environ
                       and os.environ.get("TERM") != "dumb")
        self.copy = None
        self.copy_path = copy_path
        self.copy_failure: str | None = None  # why the --log copy stopped, for the report's notes
        self._stream_failed = False  # this Log's own stream failed (stdout's are recorded by process/streams.py)
        if copy_path:
            path = Path(copy_path)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self.copy = path.open("w", buffering=1)
            except OSError as exc:
                raise InputError(f"--log {path}: cannot write there ({exc.strerror or exc}).") from None

    @property
    def stream(self):
        """Where the lines go. With follow_stderr (`debug-nan run`: the user's script runs in this process), the
        process's stderr as it is now: a script that replaces `sys.stderr` (re-wraps it in another encoding,
        detaching the old one) still gets debug-nan's lines, on its new one."""
        return sys.stderr if self._follows_stderr else self._stream

    @stream.setter
    def stream(self, value) -> None:
        self._follows_stderr, self._stream = False, value

    @contextmanager
    def keep_stream(self):
        """While the script's output is redirected into a sink (a replay runs its code again), the log keeps the
        stream it has now."""
        follows, self._stream = self._follows_stderr, self.stream
        self._follows_stderr = False
        try:
            yield
        finally:
            self._follows_stderr = follows

    @property
    def stdout_closed(self) -> bool:
        """The log's stream stopped (`| head`, a hung-up terminal, a full disk): the rest is in --log only."""
        return self._stream_failed or (self.stream is sys.stdout and streams.failure("stdout") is not None)

    def paint(self, text: str, colour: str) -> str:
        return f"\033[{COLOURS[colour]}m{text}\033[0m" if self.colour else text

    def __call__(self, line: str = "", colour: str | None = None) -> None:
        if len(line) > (width := log_width()) > 0:  # within 100 columns: a longer line wraps under its text
            for part in fit(line, width):
                self(part, colour)
            return
        try:
            self.stream.write((self.paint(line, colour) if colour else line) + "\n")
            self.stream.flush()
        except (OSError, ValueError):  # a stream of the caller's (the cli's own are guarded: process/streams.py)
            self._stream_closed()
        self._copy_line(line)

    def _stream_closed(self) -> None:
        """The reader of stdout went away: go on quietly, the rest to /dev/null (also what Python flushes at
        exit, which would otherwise print a BrokenPipeError)."""
        self._stream_failed = True
        devnull = open(os.devnull, "w")
        try:
            if self.stream is sys.stdout or self.stream is sys.__stdout__:
                os.dup2(devnull.fileno(), sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        self.stream = devnull

    def _copy_line(self, line: str) -> None:
        if not self.copy:
            return
        try:
            self.copy.write(line + "\n")
        except OSError as exc:
            self._copy_failed(exc)

    def _copy_failed(self, exc: OSError) -> None:
        """Say once that the --log copy stopped; the run goes on (stdout and the report have everything)."""
        self.copy_failure = (f"--log {self.copy_path}: writing the log copy failed ({exc.strerror or exc}); "
                             f"the copy stops there, the run went on.")
        try:
            sys.stderr.write(f"debug-nan: warning: {self.copy_failure}\n")
        except (OSError, ValueError):
            pass
        try:
            self.copy.close()
        except OSError:
            pass
        self.copy = None

    def rule(self, title: str = "", char: str = "=") -> None:
        width = min(80, log_width() or 80)  # never wider than the log's lines
        self(f"{char * 3} {title} {char * max(3, width - 5 - len(title))}" if title else char * width)

    def record_error(self, message: str) -> None:
        """The run stops on bad input: its one-paragraph error goes into the log copy (the cli prints it)."""
        self._copy_line(error_line(message))

    def close(self) -> None:
        if self.copy:
            try:
                self.copy.close()
            except OSError as exc:
                self._copy_failed(exc)
            self.copy = None


class RankMarked:
    """The stream of another rank's lines: the shared stderr (as it is now), each line marked `[rank N] `. `held`:
    that rank's lines so far, held back while it was not known whether it would end alone (`debug-nan run`)."""

    def __init__(self, rank: int, held: str = ""):
        self.prefix = f"[rank {rank}] "
        if held:
            self.write(held)

    def write(self, text: str) -> None:
        sys.stderr.write("".join(self.prefix + line for line in text.splitlines(keepends=True)))

    def flush(self) -> None:
        sys.stderr.flush()
