"""A script that replaces its optimizer for a second training stage (SGD warm-up, then Adam) is watched through
both stages: the watch follows the newest optimizer, and a NaN its update makes is traced in that optimizer."""

from tests.support.run.script_runs import same_as_alone

STAGES = """import sys
import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
model[2].bias.requires_grad_(True)
g = torch.Generator().manual_seed(2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
for step in range(1, 7):
    if step == 4:  # stage two
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, eps=float(sys.argv[1]))
    x = torch.randn(16, 4, generator=g)
    loss = model(x).pow(2).mean() + 0.0 * model[0].weight[0, 0]
    loss.backward()
    if step >= 4:
        model[0].weight.grad[0, 1] = 0.0  # a weight whose gradient is exactly 0 (eps=0: Adam divides 0 by 0)
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} {type(optimizer).__name__} loss {loss.item():.5f}")
"""


def test_a_second_stage_optimizer_is_followed(tmp_path, run_here):
    (tmp_path / "stages.py").write_text(STAGES)
    done, stdout, stderr = same_as_alone(run_here, tmp_path / "stages.py", "1e-8")
    assert "step 6 Adam" in stdout
    assert (done.report["status"], done.report["steps_run"]) == ("clean", 6)
    assert "the script replaced its optimizer with a new Adam" in " ".join(stderr.split())


def test_a_nan_in_the_second_stage_is_traced_in_its_optimizer(tmp_path, run_here):
    (tmp_path / "stages.py").write_text(STAGES)
    done, _, _ = run_here("python", "stages.py", "0.0")
    assert done.code == 1, done.output
    first = done.first
    assert (first["step"], first["phase"], first["module"], first["cause"]) == (4, "optimizer", "0",
                                                                               "nonfinite_parameter")
    assert first["op"] is not None and "Adam" in first["explanation"]
