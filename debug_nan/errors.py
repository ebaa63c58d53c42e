"""Errors the user can fix (exit code 2), and how to name where user code raised."""

import traceback
from pathlib import Path


class InputError(Exception):
    """Bad usage or bad input (a file, a sample, an option). The CLI prints the message and exits 2."""

    exit_code = 2


def describe_exception(exc: BaseException) -> str:
    """'ValueError: message (at file.py:12)', at the innermost frame outside torch and the tool's driver."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "/torch/" not in f.filename and "debug_nan/train/" not in f.filename]
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"
