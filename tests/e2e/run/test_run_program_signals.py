"""SIGTERM sent to `debug-nan run -- bash train.sh` reaches every process of the command, the shell's python too (as
SLURM and `timeout` signal a whole job): the training process leaves its result as it dies by SIGTERM, debug-nan
waits for it, and the one summary and report say the run was interrupted by SIGTERM, exit 143."""

import json
import signal
import subprocess
import sys

import pytest

from tests.support.run.side_by_side import env

pytestmark = pytest.mark.processes  # a signal reaches the processes of a program

LOOP = """import time

import torch

torch.manual_seed(0)
model = torch.nn.Linear(3, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(200):
    model(torch.randn(4, 3)).pow(2).mean().backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step}", flush=True)
    time.sleep(0.05)
"""
SHELL = f"#!/bin/bash\n{sys.executable} loop.py\necho 'the shell went on'\n"  # (not its last command: no exec)


def test_sigterm_to_debug_nan_reaches_the_shell_scripts_python_and_exits_143(tmp_path):
    (tmp_path / "loop.py").write_text(LOOP)
    (tmp_path / "train.sh").write_text(SHELL)
    process = subprocess.Popen([sys.executable, "-m", "debug_nan", "run", "--report", "run.json", "--", "bash",
                                "train.sh"], cwd=tmp_path, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True)
    first = process.stdout.readline()  # the first step has printed: the process trains, watched
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)  # (stdout's end: every process that held it has ended)
    assert first == "step 0\n" and process.returncode == 143, err
    assert "the shell went on" not in out
    said = " ".join(err[err.index("=== SUMMARY ==="):].split())
    assert err.count("=== SUMMARY ===") == 1 and "(SIGTERM, exit 143)" in said and "Ctrl-C" not in said
    report = json.loads((tmp_path / "run.json").read_text())
    assert (report["status"], report["interrupted"], report["exit_code"]) == ("clean", True, 143)
    assert report["integration"]["processes_watched"] == 1 and report["ranks"][0]["steps_run"] >= 1
