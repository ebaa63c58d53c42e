"""A program that cannot be started under `debug-nan run` (not found, not executable) is exit 2 with its report,
before anything runs (in this process); and debug-nan inside a launcher (`accelerate launch -m debug_nan run`)
still works (real processes)."""

import json
import subprocess
import sys

import pytest

from tests.support.run.side_by_side import TRAIN, env, plain

ACCELERATE = """import torch
from accelerate import Accelerator

accelerator = Accelerator(cpu=True)
""" + TRAIN.replace("import torch\n", "").replace(
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n",
    "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel, optimizer = accelerator.prepare(model, "
    "optimizer)\n").replace("    loss.backward()\n", "    accelerator.backward(loss)\n")


def test_a_program_not_found_or_not_executable_is_exit_2_with_its_report(tmp_path, run_here):
    """A program (not Python run here) that cannot be started: one paragraph, exit 2, the error report written
    (app/run_program.py; a launcher itself is run and followed: tests/e2e/ddp/test_run_launched.py)."""
    (tmp_path / "train.sh").write_text("#!/bin/bash\ntorchrun train.py\n")  # not executable
    for words, said in ((["no-such-launcher-7", "train.py"], "no-such-launcher-7: command not found"),
                        (["./train.sh"], "./train.sh is not an executable file (chmod +x it")):
        done, stdout, stderr = run_here(*words)
        assert done.code == 2 and stdout == "", stderr
        assert said in " ".join(stderr.split()) and "Traceback" not in stderr
        report = json.loads((tmp_path / "run.json").read_text())
        assert (report["status"], report["exit_code"]) == ("error", 2) and said in " ".join(report["error"].split())


@pytest.mark.processes
def test_the_advised_accelerate_command_watches_the_worker(tmp_path):
    pytest.importorskip("accelerate")
    (tmp_path / "train.py").write_text(ACCELERATE)
    alone = plain("train.py", cwd=tmp_path)
    launcher = [sys.executable, "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "1",
                "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    done = subprocess.run([*launcher, "-m", "debug_nan", "run", "--report", "run.json", "--", "train.py"],
                          cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=300)
    assert (alone.returncode, done.returncode) == (0, 0), done.stderr
    assert done.stdout == alone.stdout and alone.stdout.count("\n") == 3
    assert '"steps_run": 3' in (tmp_path / "run.json").read_text()
