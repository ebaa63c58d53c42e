"""CI installs the tested versions: scripts/setup.sh installs the test extras with `-c constraints.txt` in its own
.venv and under CI=true, never in a user's own environment unless asked, and constraints.txt pins every test extra
(never torch: a GPU node keeps its CUDA torch). Run with a fake pip that records its arguments."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from debug_nan.settings import tomllib  # (tomli on Python 3.10)
from tests.conftest import REPO
from tests.test_outputs import FAKE_PIP


def _pins() -> dict[str, str]:
    lines = (REPO / "constraints.txt").read_text().splitlines()
    pins = [line.split("==") for line in lines if line and not line.startswith("#")]
    return {re.sub(r"[-_.]+", "-", name).lower(): version for name, version in pins}


def test_constraints_pin_every_test_extra_and_never_torch():
    pins = _pins()
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    wanted = {re.split(r"[<>=!~\[ ]", req, maxsplit=1)[0].lower() for reqs in extras.values() for req in reqs}
    assert wanted and not wanted - set(pins), f"test extras without a pin in constraints.txt: {wanted - set(pins)}"
    assert "torch" not in pins and not any(name.startswith("nvidia") for name in pins)
    assert pins["pytest"] and pins["transformers"]


@pytest.mark.parametrize("where, env, pinned", [
    ("fresh .venv", {}, True),
    ("fresh .venv, DEBUG_NAN_CONSTRAINTS=0", {"DEBUG_NAN_CONSTRAINTS": "0"}, False),
    ("user's active env", {"VIRTUAL_ENV": "x"}, False),
    ("user's active env, CI=true", {"VIRTUAL_ENV": "x", "CI": "true"}, True),
    ("user's active env, DEBUG_NAN_CONSTRAINTS=1", {"VIRTUAL_ENV": "x", "DEBUG_NAN_CONSTRAINTS": "1"}, True),
])
def test_setup_pins_the_test_extras_in_its_venv_and_in_ci_only(tmp_path, where, env, pinned):
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    shutil.copy(REPO / "constraints.txt", tmp_path / "constraints.txt")
    venv, bin_ = tmp_path / ".venv" / "bin", tmp_path / "bin"
    venv.mkdir(parents=True)
    bin_.mkdir()
    (venv / "python").write_text("#!/bin/sh\nexit 1\n")  # a fresh venv: no torch
    (bin_ / "python").write_text("#!/bin/sh\nexit 0\n")  # the user's env: torch there
    (tmp_path / "pip").write_text(FAKE_PIP)
    for exe in (venv / "python", bin_ / "python", tmp_path / "pip"):
        exe.chmod(0o755)
    log = tmp_path / "pip.log"
    base = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX", "CI",
                                                               "DEBUG_NAN_CONSTRAINTS")}
    run_env = dict(base, PATH=f"{bin_}{os.pathsep}{base['PATH']}", DEBUG_NAN_GPU="0", DEBUG_NAN_PIP=str(tmp_path / "pip"),
                   PIP_LOG=str(log), FAKE_DEFAULT="cpu", FAKE_CPU_INDEX="ok", **env)
    proc = subprocess.run(["bash", str(tmp_path / "scripts" / "setup.sh")], env=run_env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    extras = [c for c in log.read_text().splitlines() if ".[test]" in c]
    assert len(extras) == 1, log.read_text()
    assert extras[0].endswith("-e .[test] -c constraints.txt" if pinned else "-e .[test]"), (where, extras[0])
    torch_installs = [c for c in log.read_text().splitlines() if "torch==" in c and "--dry-run" not in c]
    assert torch_installs == ([] if "VIRTUAL_ENV" in env else ["pip install -q torch==2.13.0"])
