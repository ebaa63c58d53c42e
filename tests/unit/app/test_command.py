"""How `debug-nan run` reads the user's command (app/command.py): the forms of a command it resolves, what it says
when one is wrong, and the exit codes as Python maps them."""


import os
import shutil
import sys

import pytest

from debug_nan.app.command import exit_code, resolve, run
from debug_nan.errors import InputError


def test_resolve_the_forms_of_a_command(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    script = resolve(["python", "-u", "train.py", "--lr", "3"])
    assert (script.kind, script.target, script.argv) == ("script", str(tmp_path / "train.py"),
                                                          ["train.py", "--lr", "3"])
    assert resolve(["train.py"]).kind == "script"
    module = resolve(["python3", "-m", "pkg.train", "--x"])
    assert (module.kind, module.target, module.argv) == ("module", "pkg.train", ["pkg.train", "--x"])
    entry = resolve(["debug-nan", "--version"])  # this package's own console script
    assert (entry.kind, entry.target, entry.argv[1:]) == ("entry point", "debug_nan.app.cli:main", ["--version"])


def test_a_program_that_is_not_python_run_here_is_a_program(tmp_path, monkeypatch):
    """Launchers, shell scripts and other executables run as a child with the start-up hook (app/run_program.py)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.sh").write_text("#!/bin/bash\ntorchrun train.py\n")
    (tmp_path / "train.sh").chmod(0o755)
    (tmp_path / "job").write_text("#!/bin/sh\nsrun python train.py\n")
    (tmp_path / "job").chmod(0o755)
    for words in (["python", "-m", "torch.distributed.run", "train.py"], ["./train.sh", "--lr", "3"],
                  ["train.sh"], ["job"], ["bash", "train.sh"], ["sh", "-c", "true"]):
        command = resolve(words)
        assert command.kind == "program" and command.argv == words, words
        assert os.access(command.target, os.X_OK)
    assert resolve(["bash", "train.sh"]).target == shutil.which("bash")
    (tmp_path / "notes.sh").write_text("echo\n")  # not executable
    with pytest.raises(InputError, match="notes.sh is not an executable file"):
        resolve(["notes.sh"])
    (tmp_path / "job.py").write_text("#!/usr/bin/env python\n")  # a Python script: run here, as before
    assert resolve(["job.py"]).kind == "script"
    true = shutil.which("true")  # a program of machine code given by its path (no shebang to read)
    assert (resolve([true]).kind, resolve([true]).target) == ("program", os.path.abspath(true))
    (tmp_path / "train").write_text("import torch\n")  # a text file without a shebang: a Python script, as Python
    assert resolve(["./train"]).kind == "script"


@pytest.mark.parametrize("words, message", [
    ([], "needs the command to run after `--`"),
    (["python", "missing.py"], "the script missing.py does not exist"),
    (["python", "-c", "print(1)"], "other interpreter options are not supported"),
    (["python", "-m"], "`python -m` needs a module name"),
    (["no-such-program-19"], "no-such-program-19: command not found"),
])
def test_resolve_says_what_is_wrong(tmp_path, monkeypatch, words, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve(words)


def test_exit_codes_as_python_maps_them(capsys):
    assert (exit_code(None), exit_code(3)) == (0, 3)
    assert exit_code("stopped: bad data") == 1 and capsys.readouterr().err == "stopped: bad data\n"


def test_a_finished_scripts_objects_live_on_as_plain_pythons_main_does(tmp_path, monkeypatch):
    """Freed when the script returned, its objects' destructors ran in the middle of debug-nan's own work: a gloo
    process group's hung the rank (its thread needed the GIL the destructor held; a third of the runs of an
    Accelerate loop under torchrun). Plain Python frees `__main__` at exit; so does `run` now."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import weakref\nclass Group: pass\ngroup = Group()\n"
                                       "import sys; sys.modules['_dn_probe'] = weakref.ref(group)\n")
    saved_argv, saved_path = list(sys.argv), list(sys.path)
    try:
        assert run(resolve(["python", "train.py"])) == 0
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
    probe = sys.modules.pop("_dn_probe")
    assert probe() is not None and type(probe()).__name__ == "Group"
