"""scripts/setup.sh, run with a fake pip that records its arguments: it installs the test extras with
`-c constraints.txt` in its own .venv and under CI=true, never in a user's own environment unless asked, and it never
installs a CUDA build of torch on a machine without a GPU."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from tests.conftest import REPO

CPU_TORCH = "-q --timeout 30 --retries 1 --index-url https://download.pytorch.org/whl/cpu torch==2.13.0"
FAKE_PIP = r'''#!/usr/bin/env bash
echo "pip $*" >> "$PIP_LOG"
if [[ " $* " == *" --dry-run "* ]]; then
    [[ "$FAKE_DEFAULT" == offline ]] && exit 1
    report="${@: -2:1}"
    for a in "$@"; do if [[ "$prev" == --report ]]; then report="$a"; fi; prev="$a"; done
    if [[ "$FAKE_DEFAULT" == cuda ]]; then
        printf '{"install": [{"metadata": {"name": "torch"}}, ' > "$report"
        printf '{"metadata": {"name": "nvidia-cublas-cu12"}}]}' >> "$report"
    else
        printf '{"install": [{"metadata": {"name": "torch"}}]}' > "$report"
    fi
    exit 0
fi
if [[ " $* " == *" --index-url "* && "$FAKE_CPU_INDEX" == down ]]; then exit 1; fi
exit 0
'''


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
    run_env = dict(base, PATH=f"{bin_}{os.pathsep}{base['PATH']}", DEBUG_NAN_GPU="0",
                   DEBUG_NAN_PIP=str(tmp_path / "pip"), PIP_LOG=str(log), FAKE_DEFAULT="cpu", FAKE_CPU_INDEX="ok",
                   **env)
    proc = subprocess.run(["bash", str(tmp_path / "scripts" / "setup.sh")], env=run_env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    extras = [c for c in log.read_text().splitlines() if ".[test]" in c]
    assert len(extras) == 1, log.read_text()
    assert extras[0].endswith("-e .[test] -c constraints.txt" if pinned else "-e .[test]"), (where, extras[0])
    torch_installs = [c for c in log.read_text().splitlines() if "torch==" in c and "--dry-run" not in c]
    assert torch_installs == ([] if "VIRTUAL_ENV" in env else ["pip install -q torch==2.13.0"])


@pytest.mark.parametrize("default, cpu_index, code, installs", [
    ("cpu", "ok", 0, ["torch==2.13.0"]),  # a default index that serves a CPU build (a CPU-only mirror)
    ("cuda", "ok", 0, [CPU_TORCH]),
    ("offline", "ok", 0, [CPU_TORCH]),
    ("cuda", "down", 1, []),  # never the CUDA build on a machine without a GPU: stop and say how
])
def test_setup_script_never_installs_cuda_torch_without_a_gpu(tmp_path, default, cpu_index, code, installs):
    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text("#!/bin/sh\nexit 1\n")  # a fresh venv: no torch
    (tmp_path / "pip").write_text(FAKE_PIP)
    for exe in (venv / "python", tmp_path / "pip"):
        exe.chmod(0o755)
    log = tmp_path / "pip.log"
    env = dict(os.environ, DEBUG_NAN_GPU="0", DEBUG_NAN_PIP=str(tmp_path / "pip"), PIP_LOG=str(log),
               FAKE_DEFAULT=default, FAKE_CPU_INDEX=cpu_index)
    env.pop("VIRTUAL_ENV", None)
    env.pop("CONDA_PREFIX", None)
    proc = subprocess.run(["bash", str(tmp_path / "scripts" / "setup.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == code, proc.stdout + proc.stderr
    calls = log.read_text().splitlines()
    torch_installs = [c.split("install ", 1)[1] for c in calls if "torch==" in c and "--dry-run" not in c]
    expected = [i if "--index-url" in i else f"-q {i}" for i in installs]
    if cpu_index == "down":  # tried the CPU index, which failed; nothing else
        assert all("--index-url" in c for c in torch_installs) and "the default index would install the CUDA build" \
            in proc.stderr
    else:
        assert torch_installs == expected
    assert not any("nvidia" in c for c in calls)
