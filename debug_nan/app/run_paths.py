"""Where `debug-nan run` writes its outputs: never over a file of the user's command.

The rule, in two halves:
- at the start, every output path is made absolute against the starting working directory (a script that
  `os.chdir`s does not move them), and an output path that already exists must be a file debug-nan may replace:
  empty, or an earlier debug-nan output (a JSON report with a `debug_nan` key, a log whose first line is
  debug-nan's, a --plot PNG whose Software is debug-nan). Anything else (the script, a module it imports, a data
  file) is refused: exit 2.
- at the end, an output path that the command opened (any `open` while it ran, read or write, seen through an
  audit hook) or imported (the `__file__` of every module in sys.modules, the script itself) is not written
  over: the output goes to `NAME.debug-nan.SUFFIX` beside it instead, and the log says so.

No torch here (the cli uses it before torch loads).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

from debug_nan.errors import InputError

_opened: set[str] = set()  # real paths the command opened while `recording` was on
_state = {"hooked": False, "recording": False}
MAX_REPORT_BYTES = 256 << 20  # a larger file is not one of ours: never read whole
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def absolute(path: str | None) -> str | None:
    """An output path against the working directory now (debug-nan's start), ~ expanded."""
    return os.path.abspath(os.path.expanduser(path)) if path else path


def replaceable(path: str, option: str) -> bool:
    """An existing file debug-nan may replace: empty, or one of its own earlier outputs."""
    try:
        if os.path.getsize(path) == 0:
            return True
        if option == "--report":
            if os.path.getsize(path) > MAX_REPORT_BYTES:
                return False
            with open(path, encoding="utf-8") as handle:
                data = json.load(handle)
            return isinstance(data, dict) and "debug_nan" in data and "status" in data
        if option == "--plot":  # a PNG whose Software text chunk (before its image data) is debug-nan's
            with open(path, "rb") as handle:
                head = handle.read(4096)
            return head.startswith(PNG_SIGNATURE) and b"tEXtSoftware\x00debug-nan" in head.split(b"IDAT", 1)[0]
        with open(path, encoding="utf-8", errors="replace") as handle:
            first = handle.readline(200)
        return first.startswith(("[debug-nan]", "debug-nan"))
    except (OSError, ValueError):
        return False


def refuse_foreign(outputs: dict[str, str | None]) -> None:
    """Exit 2 (InputError) when an output path names an existing file that is not debug-nan's to replace."""
    for option, path in outputs.items():
        if not path or not os.path.lexists(path):
            continue
        if os.path.isdir(path) or not os.path.isfile(path) or replaceable(path, option):
            continue  # (a folder, a device: check_writable says what is wrong with it)
        raise InputError(f"{option} {path} already exists and is not an earlier debug-nan output (a JSON report, "
                         f"log or plot it wrote, or an empty file): it may be a file of your command (its script, a "
                         f"module it imports, its data), and debug-nan never writes over those. Give {option} a "
                         f"new path, or delete that file if it is yours to lose.")


def _audit(event: str, args) -> None:
    if event == "open" and _state["recording"] and args and isinstance(args[0], (str, bytes, os.PathLike)):
        try:
            _opened.add(os.path.realpath(os.fsdecode(args[0])))
        except (TypeError, ValueError, OSError):
            pass


def record_opens(on: bool) -> None:
    """Record (on=True) or stop recording every file the process opens: the command's reads and writes."""
    if on and not _state["hooked"]:
        sys.addaudithook(_audit)  # (an audit hook cannot be removed: it records only while `recording`)
        _state["hooked"] = True
    if on:
        _opened.clear()
    _state["recording"] = on


def _used(path: str, script: str | None) -> str | None:
    """How the command used the file at `path` (read, wrote or imported it), or None."""
    real = os.path.realpath(path)
    if script and os.path.realpath(script) == real:
        return "it is the command's script"
    if real in _opened:
        return "the command opened it while it ran"
    for module in list(sys.modules.values()):
        file = getattr(module, "__file__", None)
        if isinstance(file, str) and os.path.realpath(file) == real:
            return f"the command imported it (module {module.__name__})"
    return None


def aside(path: str, option: str) -> str:
    """report.json -> report.debug-nan.json (then report.debug-nan-2.json, ... while taken by another file)."""
    p = Path(path)
    for n in range(1, 100):
        candidate = str(p.with_name(f"{p.stem}.debug-nan{'' if n == 1 else f'-{n}'}{p.suffix}"))
        if not os.path.lexists(candidate) or (replaceable(candidate, option)
                                              and _used(candidate, None) is None):
            return candidate
    raise InputError(f"no free name beside {path} for debug-nan's output.")


def destination(path: str | None, option: str, script: str | None, say) -> str | None:
    """Where the output meant for `path` goes at the end: there, or beside it when the command used that file
    or when it is now a file that debug-nan may not replace (a child process of the command wrote it); `say(line)`
    tells the user."""
    if not path:
        return path
    why = _used(path, script) or ("it is a file debug-nan did not write" if os.path.isfile(path)
                                  and not replaceable(path, option) else None)
    if why is None:
        return path
    moved = aside(path, option)
    say(f"[debug-nan] {option} {path}: not written there ({why}); written to {moved} instead.")
    return moved


def partial(path: str | None) -> str | None:
    """The file the --log copy streams into while the command runs (hidden, beside it): the log is moved to its
    place at the end, once it is known that the command did not use that path."""
    if not path:
        return path
    p = Path(path)
    return str(p.with_name(f".{p.name[:200]}.debug-nan-partial"))


def place(streamed: str | None, path: str | None, option: str, script: str | None, say) -> str | None:
    """Move the streamed copy to `path` (or beside it, said, when the command used that file) -> where it is."""
    if not streamed or not os.path.exists(streamed):
        return None
    where = destination(path, option, script, say)
    try:
        os.replace(streamed, where)
    except OSError as exc:
        say(f"[debug-nan] {option} {path}: could not be written ({exc.strerror or exc}); the log is in {streamed}.")
        return streamed
    return where
