"""The user's command, run in this process as Python would run it: `python train.py ARGS`, `python -m pkg.mod
ARGS`, `train.py ARGS`, or an installed console script (`aam pretrain ...`, found through its entry point).

The script sees its usual sys.argv, `__main__`, sys.path[0] and working directory; its exit code is returned
(SystemExit's code as Python maps it: None -> 0, an int, anything else printed on stderr -> 1).
"""

from __future__ import annotations

import os
import runpy
import shutil
import sys
from dataclasses import dataclass
from importlib import metadata

from debug_nan.errors import InputError

PYTHON_FLAGS_IGNORED = ("-u", "-B")  # unbuffered output, no .pyc files: nothing that changes what runs


@dataclass
class Command:
    kind: str  # "script" | "module" | "entry point"
    target: str  # the script's path, the module's name, or "module:function" of the entry point
    argv: list[str]  # sys.argv as the program sees it
    words: list[str]  # the command as the user typed it (for the log and the re-execution)

    def describe(self) -> str:
        return " ".join(self.words)


def _is_python(word: str) -> bool:
    name = os.path.basename(word)
    return name.startswith("python") and not name.endswith(".py")


def resolve(words: list[str]) -> Command:
    """The command line after `--` -> a Command, or InputError (exit 2) naming what is missing."""
    if not words:
        raise InputError("debug-nan run needs the command to run after `--`, e.g. "
                         "`debug-nan run -- python train.py --lr 3e-4`.")
    rest = list(words)
    if _is_python(rest[0]):
        rest.pop(0)
        while rest and rest[0] in PYTHON_FLAGS_IGNORED:
            rest.pop(0)
        if rest and rest[0] == "-m":
            if len(rest) < 2:
                raise InputError("`python -m` needs a module name: debug-nan run -- python -m package.module ARGS.")
            return Command("module", rest[1], [rest[1], *rest[2:]], list(words))
        if not rest or rest[0].startswith("-"):
            raise InputError(f"debug-nan run -- {' '.join(words)}: give the script (python train.py ARGS) or "
                             f"the module (python -m package.module ARGS); other interpreter options are not "
                             f"supported (only {', '.join(PYTHON_FLAGS_IGNORED)}).")
    if rest[0].endswith(".py") or os.path.isfile(rest[0]) and not _entry_point(rest[0]):
        path = rest[0]
        if not os.path.isfile(path):
            raise InputError(f"the script {path} does not exist (working directory {os.getcwd()}).")
        return Command("script", os.path.abspath(path), [path, *rest[1:]], list(words))
    point = _entry_point(os.path.basename(rest[0]))
    if point is None:
        found = shutil.which(rest[0])
        hint = (f"{found} is a program but not a Python console script of this environment ({sys.executable}); "
                f"debug-nan runs Python in its own process" if found else "no such script or console script")
        raise InputError(f"debug-nan run -- {rest[0]}: {hint}. Give a script (train.py), a module "
                         f"(python -m package.module) or a console script installed in this Python environment.")
    return Command("entry point", point.value, [shutil.which(rest[0]) or rest[0], *rest[1:]], list(words))


def _entry_point(name: str):
    found = metadata.entry_points(group="console_scripts", name=name)
    return next(iter(found), None)


def exit_code(code) -> int:
    """SystemExit's code as Python's own exit maps it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


def run(command: Command) -> int:
    """Run the command here -> its exit code. Exceptions other than SystemExit propagate (the caller decides)."""
    saved_argv, saved_path0 = sys.argv, sys.path[0] if sys.path else None
    sys.argv = list(command.argv)
    try:
        if command.kind == "script":
            sys.path[0] = os.path.dirname(command.target)
            runpy.run_path(command.target, run_name="__main__")
        elif command.kind == "module":
            sys.path[0] = os.getcwd()
            runpy.run_module(command.target, run_name="__main__", alter_sys=True)
        else:
            function = metadata.EntryPoint(name="", value=command.target, group="console_scripts").load()
            return exit_code(function())
        return 0
    except SystemExit as stop:
        return exit_code(stop.code)
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None:
            sys.path[0] = saved_path0
