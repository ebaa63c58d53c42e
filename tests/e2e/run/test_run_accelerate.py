"""A plain loop through Accelerate (`accelerator.prepare`, its optimizer wrapper stepped by the script): an update
made non-finite by the learning rate is placed at the script's own `optimizer.step()`, and the schedule behind
that lr is found through the wrapper, whichever object the script built it on."""

import pytest

from tests.support.run.script_runs import tripped

pytest.importorskip("accelerate")

SCRIPT = """import torch
from accelerate import Accelerator
from torch import nn

torch.manual_seed(0)
accelerator = Accelerator(cpu=True)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
{schedule}
for step in range(1, 6):
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    loss = (model(x) - y).pow(2).mean()
    accelerator.backward(loss)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad()
    print(f"step {{step}} loss {{loss.item():.4f}}")
"""

WARMUP = 'lambda done: float("nan") if done == 2 else 1.0'  # a warmup whose third value divides 0 by 0
SCHEDULES = {
    # built on the AcceleratedOptimizer after prepare(): the scheduler's optimizer is the wrapper
    "on the wrapper": f"model, optimizer = accelerator.prepare(model, optimizer)\n"
                      f"scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, {WARMUP})",
    # built on the torch optimizer, then prepared with it: the script steps an AcceleratedScheduler
    "prepared": f"scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, {WARMUP})\n"
                f"model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)",
}


@pytest.mark.parametrize("how", sorted(SCHEDULES))
def test_a_nan_learning_rate_is_placed_at_the_scripts_step_with_its_schedule(tmp_path, run_here, how):
    source = SCRIPT.format(schedule=SCHEDULES[how])
    first, stdout, _ = tripped(run_here, tmp_path, source, "train.py")
    line = source.splitlines().index("    optimizer.step()") + 1
    assert (first["step"], first["phase"], first["cause"], first["module"]) == (
        3, "optimizer", "nonfinite_parameter", "0")
    assert first["source"] == f"train.py:{line}"
    assert "the schedule LambdaLR set it after 2 of its steps" in first["explanation"]
    assert "no scheduler is attached" not in first["explanation"]
    assert stdout.count("\n") == 3
