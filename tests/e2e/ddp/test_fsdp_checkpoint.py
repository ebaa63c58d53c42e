"""`torchrun --nproc_per_node=2 -m debug_nan --task ... --fsdp --checkpoint CKPT`: a run resumed into the model sharded
by FSDP2 continues where the checkpoint left it, as a two-rank plain loop does, and reaches that loop's NaN at the
same step. The checkpoint holds full tensors, its optimizer state keyed by parameter number (a plain run's, DDP's)
or by parameter name (FSDP1's full optim_state_dict, AAM's default `--fsdp` checkpoint); each rank keeps its slice.

The task (tests/support/tasks/resume_task.py) drives one weight towards log(2 - w x) < 0 with SGD and momentum: only
a run that continues from step K's weight AND momentum reaches the NaN at the plain loop's step."""

import json
import math
from pathlib import Path

import pytest
import torch

from tests.e2e.ddp.test_run_ddp import torchrun
from tests.support.tasks import resume_task

TASK = Path(resume_task.__file__)
K = 10  # the plain loop saves its checkpoint after this many optimizer steps


def two_rank_plain_run(tmp_path: Path, layout) -> tuple[Path, int]:
    """What two DDP ranks do, in one process: step s deals micro-batch 2(s-1) to rank 0 and 2(s-1)+1 to rank 1
    (drivers/task.py: micro-batch i goes to rank i % 2), averages their gradients and steps. Saves `layout(model,
    optimizer, step)` after step K -> (checkpoint path, the first step where either rank's loss is not finite)."""
    t = resume_task.build()
    model, optimizer, batches = t["model"], t["optimizer"](t["model"].parameters()), t["batches"]
    path = tmp_path / "ckpt.pt"
    for step in range(1, 200):
        losses = [t["loss"](model, batches[(2 * (step - 1) + r) % len(batches)]) for r in (0, 1)]
        if not all(math.isfinite(loss.item()) for loss in losses):
            return path, step
        optimizer.zero_grad()
        (sum(losses) / 2).backward()
        optimizer.step()
        if step == K:
            torch.save(layout(model, optimizer, step), path)
    raise AssertionError("the plain loop never went non-finite")


def by_number(model, optimizer, step):
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}


def by_name(model, optimizer, step):
    """FSDP1's full state dicts (FSDP.optim_state_dict under FULL_STATE_DICT): the optimizer keyed by parameter name."""
    names = {id(p): n for n, p in model.named_parameters()}
    params = [p for g in optimizer.param_groups for p in g["params"]]
    number = optimizer.state_dict()
    name_of = dict(zip([k for g in number["param_groups"] for k in g["params"]], [names[id(p)] for p in params]))
    return {"model_state_dict": model.state_dict(), "global_step": step,
            "optimizer_state_dict": {"state": {name_of[k]: v for k, v in number["state"].items()},
                                     "param_groups": [{**g, "params": [name_of[k] for k in g["params"]]}
                                                      for g in number["param_groups"]]}}


@pytest.mark.parametrize("layout", [by_number, by_name])
def test_a_sharded_resume_reaches_the_plain_loops_nan_at_the_same_step(tmp_path, layout):
    path, nan_step = two_rank_plain_run(tmp_path, layout)
    assert nan_step > K + 3  # the NaN is well after the checkpoint
    proc = torchrun("-m", "debug_nan", "--task", f"{TASK}:build", "--device", "cpu", "--fsdp", "--no-bundle",
                    "--checkpoint", str(path), "--skip-batches", str(K), "--max-steps", "30", "--report", "r.json",
                    cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "fsdp: the model sharded with FSDP2 over 2 ranks" in proc.stdout
    assert f"loaded model, optimizer; the run continues at step {K + 1}" in proc.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    first = report["first_nonfinite"]
    assert (first["step"], first["phase"], first["cause"]) == (nan_step, "loss", "log_of_nonpositive")
    assert report["steps_run"] == nan_step - K
