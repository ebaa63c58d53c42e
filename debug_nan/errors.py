"""Errors the user can fix (exit code 2), and how to name where user code raised."""

import traceback

from debug_nan.frames import short_path, user_frame_of_traceback


class InputError(Exception):
    """Bad usage or bad input (a file, a sample, an option). The CLI prints the message and exits 2."""

    exit_code = 2


def describe_exception(exc: BaseException) -> str:
    """'ValueError: message (at model.py:12)', at the innermost user frame (debug_nan.frames decides which)."""
    frame = user_frame_of_traceback(traceback.extract_tb(exc.__traceback__))
    where = f" (at {short_path(frame.filename)}:{frame.lineno})" if frame is not None else ""
    return f"{type(exc).__name__}: {exc}{where}"
