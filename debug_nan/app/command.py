"""The user's command: a program that is not Python run here (a launcher, a shell script: a "program" Command, which
app/run_program.py starts as a child), or Python run in this process as Python would run it: `python train.py
ARGS`, `python -m pkg.mod ARGS`, `train.py ARGS`, or an installed console script (`aam pretrain ...`, found through
its entry point).

The script sees what `python SCRIPT` gives it: sys.argv[0] as typed, `__file__` absolute (the working directory
joined to what was typed), sys.path[0] the folder of the script's real file (a symlink resolved), a folder or a
.zip with a `__main__.py` run as Python runs them (sys.path[0] the folder or archive); its exit code is returned
(SystemExit's code as Python maps it: None -> 0, an int, anything else printed on stderr -> 1).
"""

from __future__ import annotations

import builtins
import importlib.machinery
import io
import os
import runpy
import shutil
import sys
import zipfile
from dataclasses import dataclass
from importlib import metadata

from debug_nan.errors import InputError

PYTHON_FLAGS_IGNORED = ("-u", "-B")  # unbuffered output, no .pyc files: nothing that changes what runs


@dataclass
class Command:
    kind: str  # "script" | "module" | "entry point" (run here) | "program" (run as a child, app/run_program.py)
    target: str  # the script's (or folder's, archive's, program's) absolute path, the module, or "module:function"
    argv: list[str]  # sys.argv as the program sees it
    words: list[str]  # the command as the user typed it (for the log and the report)

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
    program = _program(words)
    if program is not None:
        return program
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
    if rest[0].endswith(".py") or _runnable_folder(rest[0]) or os.path.isfile(rest[0]) and not _entry_point(rest[0]):
        path = rest[0]
        if not os.path.isfile(path) and not _runnable_folder(path):
            raise InputError(f"the script {path} does not exist (working directory {os.getcwd()}).")
        # absolute as Python makes it: the working directory joined, nothing normalised (its __file__)
        return Command("script", os.path.join(os.getcwd(), path), [path, *rest[1:]], list(words))
    point = _entry_point(os.path.basename(rest[0]))  # (anything else is a program: _program)
    return Command("entry point", point.value, [shutil.which(rest[0]) or rest[0], *rest[1:]], list(words))


LAUNCHERS = {  # programs (or their modules under `python -m`) that train in worker processes of their own
    "torchrun", "torch.distributed.run", "torch.distributed.launch", "accelerate", "accelerate-launch",
    "accelerate.commands.launch", "deepspeed", "deepspeed.launcher.runner", "lightning", "srun", "mpirun",
}


def _program(words: list[str]) -> Command | None:
    """A command that is not Python run in this process -> a program Command (run as a child with the start-up
    hook, app/run_program.py): a launcher (torchrun, `accelerate launch`, `python -m torch.distributed.run`), a
    shell script, any other executable. None: Python, run here."""
    first = words[0]
    if _is_python(first):
        at = words.index("-m") + 1 if "-m" in words[1:3] else None
        return _as_program(words) if at is not None and at < len(words) and words[at] in LAUNCHERS else None
    name = os.path.basename(first)
    if name in LAUNCHERS or name.endswith((".sh", ".bash", ".slurm", ".sbatch")):
        return _as_program(words)
    if first.endswith(".py") or _runnable_folder(first) or _entry_point(name) is not None and not os.path.isfile(first):
        return None
    if os.path.isfile(first):
        head = _head(first)
        if head.startswith(b"#!"):
            shebang = head.split(b"\n", 1)[0][:200].decode("utf-8", "replace")
            return None if "python" in shebang else _as_program(words)
        # machine code (ELF, Mach-O: a null byte in its first 512 bytes), which Python would refuse as a script
        # (`debug-nan run -- /bin/true`); a text file without a shebang is Python's to run
        return _as_program(words) if b"\0" in head else None
    return _as_program(words)


def _head(path: str) -> bytes:
    """The file's first 512 bytes (b"" where it cannot be read)."""
    try:
        with open(path, "rb") as handle:
            return handle.read(512)
    except OSError:
        return b""


def _as_program(words: list[str]) -> Command:
    """The program as typed; its file (a path given, else found on PATH). Not found, not executable: exit 2."""
    first = words[0]
    found = first if os.sep in first or os.path.isfile(first) and not shutil.which(first) else shutil.which(first)
    if found is None or not os.path.exists(found):
        raise InputError(f"debug-nan run -- {' '.join(words)}: {first}: command not found (no such file here, in "
                         f"{os.getcwd()}, nor a program on PATH).")
    if os.path.isdir(found) or not os.access(found, os.X_OK):
        raise InputError(f"debug-nan run -- {' '.join(words)}: {first} is not an executable file (chmod +x it, "
                         f"or give its interpreter: debug-nan run -- bash {first} ...).")
    return Command("program", os.path.abspath(found), list(words), list(words))


def _runnable_folder(path: str) -> bool:
    """A folder or a zip archive with a __main__.py: `python app/`, `python app.zip`."""
    if os.path.isdir(path):
        return os.path.isfile(os.path.join(path, "__main__.py"))
    return os.path.isfile(path) and zipfile.is_zipfile(path)


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


# The namespaces of the commands that ran, kept to the end as plain Python keeps `__main__`'s: freed on return, a
# script's objects (a gloo process group among them) would be destroyed while its threads still need the GIL.
_FINISHED: list = []


def run(command: Command) -> int:
    """Run the command here -> its exit code. Exceptions other than SystemExit propagate (the caller decides)."""
    saved_argv, saved_path0 = sys.argv, sys.path[0] if sys.path else None
    sys.argv = list(command.argv)
    try:
        if command.kind == "script" and _runnable_folder(command.target):
            sys.path[0] = command.target
            _run_main_of_folder()
        elif command.kind == "script":
            sys.path[0] = os.path.dirname(os.path.realpath(command.target))
            _run_script(command.target)
        elif command.kind == "module":
            sys.path[0] = os.getcwd()
            _FINISHED.append(runpy.run_module(command.target, run_name="__main__", alter_sys=True))
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


def _run_script(path: str) -> None:
    """`python SCRIPT`: its code run as `__main__` (sys.modules' `__main__` while it runs, so that its classes
    pickle), sys.argv left as it is (runpy.run_path would put the path in sys.argv[0])."""
    with io.open_code(path) as handle:
        code = compile(handle.read(), path, "exec", dont_inherit=True)
    module = type(sys)("__main__")
    module.__dict__.update(__file__=path, __cached__=None, __loader__=importlib.machinery.SourceFileLoader(
        "__main__", path), __package__=None, __spec__=None, __builtins__=builtins)
    saved = sys.modules.get("__main__")
    sys.modules["__main__"] = module
    _FINISHED.append(module)
    try:
        exec(code, module.__dict__)
    finally:
        sys.modules["__main__"] = saved


def _run_main_of_folder() -> None:
    """`python app/` or `python app.zip` (sys.path[0] set to it): its __main__ module, found there as Python
    finds it (runpy's own steps, without the sys.argv[0] that runpy.run_path sets)."""
    saved = sys.modules.get("__main__")
    try:
        _, spec, code = runpy._get_main_module_details()  # what `python app/` runs
        module = type(sys)("__main__")
        sys.modules["__main__"] = module
        _FINISHED.append(module)
        runpy._run_code(code, module.__dict__, None, "__main__", spec)
    finally:
        sys.modules["__main__"] = saved
