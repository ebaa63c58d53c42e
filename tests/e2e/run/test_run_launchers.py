"""A launcher that trains in worker processes (accelerate launch, torchrun, deepspeed) run inside `debug-nan run`
is refused with the command to run instead (exit 2, before it starts anything: in this process); and that command,
debug-nan inside the launcher, works (real processes)."""

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


@pytest.mark.parametrize("words, instead", [
    (["accelerate", "launch", "--cpu", "train.py", "--lr", "3"],
     "`accelerate launch --cpu -m debug_nan run [OPTIONS] -- train.py --lr 3`. The ranks"),
    (["torchrun", "--nproc_per_node=2", "train.py"], "`torchrun --nproc_per_node=2 -m debug_nan run [OPTIONS] -- "
                                                     "train.py`. The ranks"),
    (["python", "-m", "torch.distributed.run", "--standalone", "train.py"],
     "`python -m torch.distributed.run --standalone -m debug_nan run [OPTIONS] -- train.py`."),
    (["deepspeed", "train.py"], "`deepspeed --module debug_nan run [OPTIONS] -- train.py` (this form is not tested"),
])
def test_a_launcher_of_workers_is_refused_with_what_to_run_instead(tmp_path, run_here, words, instead):
    (tmp_path / "train.py").write_text(TRAIN)
    done, stdout, stderr = run_here(*words)
    assert done.code == 2 and stdout == "", stderr
    said = " ".join(stderr.split())
    assert "starts the training in worker processes of its own" in said and instead in said


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
