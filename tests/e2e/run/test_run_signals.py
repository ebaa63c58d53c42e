"""SIGTERM under `debug-nan run` ends the command as it ends a plain run (no `except KeyboardInterrupt` branch of
the script runs), with the partial report and exit 143; and a SIGTERM while debug-nan itself starts (importing
torch) ends every entry point with exit 143 and the interrupted report, never a traceback from an import."""

import json
import signal
import subprocess
import sys
import time

import pytest

from tests.support.run.side_by_side import TRAIN, env, plain, watched
from tests.support.signals import handles, loaded

pytestmark = pytest.mark.processes  # signals reach a process

TERMINATED = """import os
import signal
import sys

import torch

torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
try:
    for step in range(5):
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
        model(torch.randn(4, 3)).pow(2).mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}", flush=True)
except KeyboardInterrupt:
    print("the Ctrl-C branch: checkpoint saved", flush=True)
    sys.exit(0)
"""


def test_sigterm_in_the_script_is_not_its_ctrl_c_and_exits_143_with_the_partial_report(tmp_path):
    (tmp_path / "train.py").write_text(TERMINATED)
    alone = plain("train.py", cwd=tmp_path)
    assert alone.returncode == -signal.SIGTERM and alone.stdout == "step 0\nstep 1\n"
    done, report = watched("train.py", cwd=tmp_path)
    assert done.returncode == 143, done.stderr
    assert done.stdout == alone.stdout
    assert (report["status"], report["interrupted"], report["steps_run"], report["exit_code"]) == (
        "clean", True, 2, 143)


def test_ctrl_c_still_reaches_the_scripts_own_branch(tmp_path):
    (tmp_path / "train.py").write_text(TERMINATED.replace("signal.SIGTERM)", "signal.SIGINT)"))
    alone = plain("train.py", cwd=tmp_path)
    done, report = watched("train.py", cwd=tmp_path)
    assert (alone.returncode, done.returncode) == (0, 0), done.stderr
    assert done.stdout == alone.stdout == "step 0\nstep 1\nthe Ctrl-C branch: checkpoint saved\n"
    assert (report["status"], report["steps_run"], report["interrupted"]) == ("clean", 2, False)


ENTRY_POINTS = {"cli": lambda report: ["--max-steps", "1", "--report", report],
                "run": lambda report: ["run", "--report", report, "--", "python", "train.py"],
                "replay": lambda report: ["replay", "missing-bundle.pt", "--report", report]}


@pytest.mark.parametrize("when", ["handler", "torch"])
@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
def test_sigterm_while_debug_nan_starts_exits_143_with_the_report(tmp_path, entry, when):
    """SIGTERM while debug-nan starts, at two points it has reached (never after a guessed delay): as soon as it has
    taken SIGTERM over, and inside the import of torch (libtorch loaded, its Python modules still loading: the signal
    waits for the import, then stops the run). Exit 143, the report says so, no traceback from an import. (Before
    the first point a signal kills the process as it kills any program: -15, nothing printed.)"""
    (tmp_path / "train.py").write_text(TRAIN)
    report = tmp_path / "r.json"
    process = subprocess.Popen([sys.executable, "-m", "debug_nan", *ENTRY_POINTS[entry](str(report))],
                               cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    reached = (lambda: handles(process.pid, signal.SIGTERM)) if when == "handler" else (
        lambda: loaded(process.pid, "libtorch_cpu"))
    deadline = time.monotonic() + 120  # (a guard against a process that never gets there, not a timing)
    while process.poll() is None and not reached() and time.monotonic() < deadline:
        time.sleep(0.002)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 143, (process.returncode, err)
    assert "Traceback" not in err and "RecursionError" not in err, err
    assert err.rstrip().endswith("debug-nan: interrupted (SIGTERM).")
    assert json.loads(report.read_text())["exit_code"] == 143
