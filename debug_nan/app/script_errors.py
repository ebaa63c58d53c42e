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
import types

import torch

from debug_nan.errors import describe_exception
from debug_nan.frames import raising_tool_frame, short_path

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
OVERRIDES = torch.overrides.__file__  # (handle_torch_function: how a torch function reaches a TorchFunctionMode)


def _ours(filename: str) -> bool:
    """A frame `python script.py` would not show: debug-nan's (its hooks, its runner) or runpy's."""
    return filename.startswith((PACKAGE, "<frozen runpy>")) or filename == runpy.__file__


def _shown(places: list[tuple[str, str]]) -> list[int]:
    """Which frames of a traceback (each its (file name, function name), outermost first) plain Python shows: not
    debug-nan's, and not the detour a torch function takes to reach its recorder (torch's `handle_torch_function`,
    then the same function entered again) -> their indices."""
    shown: list[int] = []
    for i, (filename, name) in enumerate(places):
        nxt = places[i + 1][0] if i + 1 < len(places) else None
        if _ours(filename) or (filename == OVERRIDES and nxt is not None and _ours(nxt)):
            continue
        before = places[i - 1][0] if i > 0 else None
        if shown and before is not None and (_ours(before) or before == OVERRIDES) \
                and places[shown[-1]] == (filename, name):
            shown.pop()  # (the torch function that handed the call to the recorder, entered again)
        shown.append(i)
    return shown


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception, and those it was raised from or while handling (each once)."""
    seen, pending, chain = set(), [exc], []
    while pending:
        one = pending.pop()
        if id(one) not in seen:
            seen.add(id(one))
            chain.append(one)
            pending += [e for e in (one.__cause__, one.__context__) if e is not None]
    return chain


def _script_traceback(exc: BaseException) -> None:
    """The traceback as Python prints it for the script: its frames and the libraries', not debug-nan's."""
    report = traceback.TracebackException.from_exception(exc)
    for one in _chain(report):
        stack = list(one.stack)
        one.stack = traceback.StackSummary.from_list([stack[i] for i in _shown([(f.filename, f.name)
                                                                                for f in stack])])
    sys.stderr.write("".join(report.format()))


def as_python_shows(exc: BaseException) -> types.TracebackType | None:
    """`exc`'s traceback as plain Python has it for the script (for the script's or Python's own excepthook, in a
    process the start-up hook watches), the exceptions in its chain likewise: without debug-nan's frames, unless
    debug-nan's own code raised it (then every frame stays, for a bug report)."""
    if raised_by_us(exc) is not None:
        return exc.__traceback__
    for one in _chain(exc):
        entries, tb = [], one.__traceback__
        while tb is not None:
            entries.append(tb)
            tb = tb.tb_next
        rebuilt = None
        for i in reversed(_shown([(t.tb_frame.f_code.co_filename, t.tb_frame.f_code.co_name) for t in entries])):
            rebuilt = types.TracebackType(rebuilt, entries[i].tb_frame, entries[i].tb_lasti, entries[i].tb_lineno)
        one.__traceback__ = rebuilt
    return exc.__traceback__


def raised_by_us(exc: BaseException) -> str | None:
    """"debug_nan/x.py:N" when the script's error was raised in debug-nan's own code, not in a call debug-nan
    only passed on for the script (frames.raising_tool_frame): debug-nan failed, not the script."""
    where = raising_tool_frame(exc)
    return None if where is None else f"{short_path(where[0])}:{where[1]}"


def blame(exc: BaseException, show: bool, clause: str) -> str:
    """The line that says whose error it is: the script's (with `show`, its traceback printed as Python prints it)
    or debug-nan's own (with `show`, the whole traceback, for a bug report)."""
    where = raised_by_us(exc)
    if where is None:
        if show:
            _script_traceback(exc)
        return f"the command raised {describe_exception(exc, first_line=True)}{clause}"
    if show:
        traceback.print_exception(type(exc), exc, exc.__traceback__, file=sys.stderr)
    return (f"debug-nan itself failed inside the command ({type(exc).__name__}: {exc}, at {where}): a bug in "
            f"debug-nan, not an error in the script; please report it with the traceback above")
