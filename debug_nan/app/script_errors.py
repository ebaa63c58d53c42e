"""Whose error it is when the user's command raises under `debug-nan run`, and its traceback as the user sees it.

An exception raised inside a torch call the script made is the script's, wherever debug-nan's recorder or hooks sit
on the stack (frames.raising_tool_frame): its traceback is the one `python script.py` prints, without debug-nan's
frames and without the detour a torch function takes to reach the recorder. Only an exception that starts in
debug-nan's own code is "debug-nan failed", with the whole traceback for a bug report.
"""

from __future__ import annotations

import os
import runpy
import sys
import traceback

import torch

from debug_nan.errors import describe_exception
from debug_nan.frames import raising_tool_frame, short_path

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
OVERRIDES = torch.overrides.__file__  # (handle_torch_function: how a torch function reaches a TorchFunctionMode)


def _ours(frame: traceback.FrameSummary) -> bool:
    """A frame `python script.py` would not show: debug-nan's (its hooks, its runner) or runpy's."""
    return frame.filename.startswith((PACKAGE, "<frozen runpy>")) or frame.filename == runpy.__file__


def _as_python_shows(stack: list) -> list:
    """The frames of a traceback without debug-nan's, and without the detour a torch function takes to reach its
    recorder (torch's `handle_torch_function`, then the same function entered again): as plain Python shows it."""
    shown = []
    for i, frame in enumerate(stack):
        nxt = stack[i + 1] if i + 1 < len(stack) else None
        if _ours(frame) or (frame.filename == OVERRIDES and nxt is not None and _ours(nxt)):
            continue
        if shown and i > 0 and (_ours(stack[i - 1]) or stack[i - 1].filename == OVERRIDES) \
                and shown[-1].filename == frame.filename and shown[-1].name == frame.name:
            shown.pop()  # (the torch function that handed the call to the recorder, entered again)
        shown.append(frame)
    return shown


def _script_traceback(exc: BaseException) -> None:
    """The traceback as Python prints it for the script: its frames and the libraries', not debug-nan's."""
    report = traceback.TracebackException.from_exception(exc)
    seen, pending = set(), [report]
    while pending:  # the exception, and those it was raised from or while handling
        one = pending.pop()
        if id(one) in seen:
            continue
        seen.add(id(one))
        one.stack = traceback.StackSummary.from_list(_as_python_shows(list(one.stack)))
        pending += [e for e in (one.__cause__, one.__context__) if e is not None]
    sys.stderr.write("".join(report.format()))


def raised_by_us(exc: BaseException) -> str | None:
    """"debug_nan/x.py:N" when the script's error was raised in debug-nan's own code, not in a call debug-nan
    only passed on for the script (frames.raising_tool_frame): debug-nan failed, not the script."""
    where = raising_tool_frame(exc)
    return None if where is None else f"{short_path(where[0])}:{where[1]}"


def blame(exc: BaseException, clause: str) -> str:
    """The line that says whose error it is: the script's (its traceback as Python prints it) or debug-nan's own
    (the whole traceback, for a bug report)."""
    where = raised_by_us(exc)
    if where is None:
        _script_traceback(exc)
        return f"the command raised {describe_exception(exc)}{clause}"
    traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    return (f"debug-nan itself failed inside the command ({type(exc).__name__}: {exc}, at {where}): a bug in "
            f"debug-nan, not an error in the script; please report it with the traceback above")
