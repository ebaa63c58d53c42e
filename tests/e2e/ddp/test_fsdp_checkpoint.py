"""`python -m debug_nan --task ... --fsdp --checkpoint CKPT` on 2 ranks (started by hand): a run resumed into the model
sharded by FSDP2 continues where the checkpoint left it, as a two-rank plain loop does, and reaches that loop's NaN
at the same step. The checkpoint holds full tensors, its optimizer state keyed by parameter number (a plain run's,
DDP's) or by parameter name (FSDP1's full optim_state_dict, AAM's default `--fsdp` checkpoint); each rank keeps its
slice.

The task (tests/support/tasks/resume_task.py) drives one weight towards log(2 - w x) < 0 with SGD and momentum: only
a run that continues from step K's weight AND momentum reaches the NaN at the plain loop's step."""

import json

import pytest

from tests.e2e.cli.test_checkpoint import K, TASK, plain_run, usual
from tests.e2e.ddp.test_run_ddp import joined, ranks


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


@pytest.mark.parametrize("layout", [usual, by_name])  # (usual: keyed by parameter number)
def test_a_sharded_resume_reaches_the_plain_loops_nan_at_the_same_step(tmp_path, layout):
    path, nan_step = plain_run(tmp_path, layout, ranks=2)
    assert nan_step > K + 3  # the NaN is well after the checkpoint (K: 20 optimizer steps)
    proc = joined(ranks("--task", f"{TASK}:build", "--device", "cpu", "--fsdp", "--no-bundle", "--checkpoint",
                        str(path), "--skip-batches", str(K), "--max-steps", "30", "--report", "r.json", cwd=tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    assert "fsdp: the model sharded with FSDP2 over 2 ranks" in proc.stdout
    assert f"loaded model, optimizer; the run continues at step {K + 1}" in proc.stdout
    report = json.loads((tmp_path / "r.json").read_text())
    first = report["first_nonfinite"]
    assert (first["step"], first["phase"], first["cause"]) == (nan_step, "loss", "log_of_nonpositive")
    assert report["steps_run"] == nan_step - K
