"""Errors the user can fix (exit code 2), and how to name where user code raised."""

import importlib
import traceback

from debug_nan.frames import short_path, user_frame_of_traceback


class InputError(Exception):
    """Bad usage or bad input (a file, a sample, an option). The CLI prints the message and exits 2."""

    exit_code = 2


class CommandRaised(InputError):
    """The user's command (`debug-nan run`) raised before it trained: its own error, exit 1 as plain Python."""

    exit_code = 1


def require_package(name: str, message: str) -> None:
    """Bad usage (exit 2) with `message` when the optional package `name` (an extra) is not installed: checked
    before the run, for the option that needs it."""
    try:
        importlib.import_module(name)
    except ImportError:
        raise InputError(message) from None


def describe_exception(exc: BaseException, first_line: bool = False) -> str:
    """'ValueError: message (at model.py:12)', at the innermost user frame (debug_nan.frames decides which).
    `first_line`: a message of several lines (torch.load's weights-only error has eight) cut to its first, for a
    line printed under the traceback that holds it whole."""
    frame = user_frame_of_traceback(traceback.extract_tb(exc.__traceback__))
    where = f" (at {short_path(frame.filename)}:{frame.lineno})" if frame is not None else ""
    message = str(exc)
    lines = message.strip().splitlines()
    if first_line and len(lines) > 1:
        message = f"{lines[0].rstrip()} [+{len(lines) - 1} lines, in the traceback above]"
    return f"{type(exc).__name__}: {message}{where}"


def describe_os_error(exc: OSError) -> str:
    """Why a file could not be opened, in words (a name over the file system's 255-byte limit said as such)."""
    import errno

    if exc.errno == errno.ENAMETOOLONG:
        return "a name in that path is longer than the file system allows (255 bytes per name)"
    if exc.errno == errno.EISDIR:
        return "it is a directory, not a file"
    return exc.strerror or str(exc)
