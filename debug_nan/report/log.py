"""The text log: stdout, line-buffered and tee-friendly, plus an optional copy (--log PATH).

Colour only on a TTY and never when NO_COLOR is set; progress bars go to stderr elsewhere.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from debug_nan.errors import InputError

COLOURS = {"red": "31", "green": "32", "yellow": "33", "bold": "1", "dim": "2"}


def error_line(message: str) -> str:
    """How an exit-2 error reads, on stderr (printed by the cli) and in the log copy."""
    return f"debug-nan: error: {message}"


class Log:
    def __init__(self, copy_path: str | None = None, stream=None):
        self.stream = stream or sys.stdout
        self.colour = (hasattr(self.stream, "isatty") and self.stream.isatty() and "NO_COLOR" not in os.environ
                       and os.environ.get("TERM") != "dumb")
        self.copy = None
        if copy_path:
            path = Path(copy_path)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                self.copy = path.open("w", buffering=1)
            except OSError as exc:
                raise InputError(f"--log {path}: cannot write there ({exc.strerror or exc}).") from None

    def paint(self, text: str, colour: str) -> str:
        return f"\033[{COLOURS[colour]}m{text}\033[0m" if self.colour else text

    def __call__(self, line: str = "", colour: str | None = None) -> None:
        self.stream.write((self.paint(line, colour) if colour else line) + "\n")
        self.stream.flush()
        if self.copy:
            self.copy.write(line + "\n")

    def rule(self, title: str = "", char: str = "=") -> None:
        self(f"{char * 3} {title} {char * max(3, 76 - len(title))}" if title else char * 80)

    def record_error(self, message: str) -> None:
        """The run stops on bad input: its one-paragraph error goes into the log copy (the cli prints it)."""
        if self.copy:
            self.copy.write(error_line(message) + "\n")

    def close(self) -> None:
        if self.copy:
            self.copy.close()
            self.copy = None
