"""A small script, written by a test, run alone (the real interpreter: the reference side of every comparison is
what `python SCRIPT` does) and through `debug-nan run`."""

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.conftest import run_process


def write(tmp_path: Path, source: str, name: str = "script.py") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def alone(script: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(script), *args], cwd=script.parent, capture_output=True, text=True,
                          timeout=300)


def watched(script: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict | None]:
    report = script.parent / "run.json"
    done = run_process("run", "--report", str(report), "--", "python", str(script), *args, cwd=script.parent)
    return done, json.loads(report.read_text()) if report.exists() else None


def same_as_alone(run_here, script: Path, *args: str):
    """The script run alone and through `run_here` (in-process): both exit 0 and print the same, byte for byte ->
    (the watched Run, its stdout, its stderr)."""
    plain = alone(script, *args)
    done, stdout, stderr = run_here("python", script.name, *args)
    assert plain.returncode == 0 and done.code == 0, done.output
    assert stdout == plain.stdout
    return done, stdout, stderr


def tripped(run_here, folder: Path, source: str, name: str, options=()) -> tuple[dict, str, str]:
    """`source` written as folder/NAME and run through `run_here` (`debug-nan run -- python NAME`, in this process,
    in `folder`): it must trip (exit 1) -> (the report's first_nonfinite, stdout, stderr)."""
    (folder / name).write_text(source)
    done, stdout, stderr = run_here("python", name, options=options)
    assert done.code == 1, done.output
    return done.first, stdout, stderr
