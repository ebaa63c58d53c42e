"""`debug-nan run --trace-at STEP:MICRO`: the explicit fallback for a micro-batch the in-place replay cannot follow.
The command runs again and that micro-batch is traced as it runs (engine/replay/live.py); the log of the first run
says so. The script here anneals a large target tensor in place between its loss and its backward, so its value at
the loss is gone by the trip; step 3's broken scale overflows the loss's square."""

from pathlib import Path

from click.testing import CliRunner

from debug_nan.app.cli import main
from tests.support.run.script_runs import tripped

ANNEALS = """import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 70_000))
targets = torch.ones(70_000)  # per-output targets the loop anneals in place (large: kept by its version)
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(1, 5):
    x = torch.randn(4, 8)
    out = model(x) * (1e20 if step == 3 else 1.0)  # step 3: a scale from a broken schedule
    loss = (out - targets).pow(2).mean()
    targets.mul_(0.999)  # the annealing, before the backward
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
"""


def test_the_log_names_the_fallback_and_the_fallback_names_the_op(tmp_path, run_here):
    first, _, stderr = tripped(run_here, tmp_path, ANNEALS, "anneals.py")
    assert (first["step"], first["micro_step"], first["cause"], first["detected_by"]) == (3, 1, "unknown", "watch")
    assert "could not be replayed in place: the script changed a (70000,) tensor in place" in first["explanation"]
    assert first["suggestions"][0].startswith("Run the command again as `debug-nan run --trace-at 3:1 -- python "
                                              "anneals.py`")

    done, stdout, stderr = run_here("python", "anneals.py", options=("--trace-at", "3:1"))
    assert done.code == 1 and stdout.count("\n") == 2, done.output
    first = done.first
    assert (first["step"], first["phase"], first["op"], first["cause"], first["source"], first["detected_by"]) == (
        3, "loss", "aten.pow.Tensor_Scalar", "overflow", "anneals.py:11", "replay")
    assert "[trace-at] step 3, micro-batch 1: traced as it runs" in stderr
    assert "ran under the op-level tracer (--trace-at): its trace is explained, no replay" in stderr


def test_a_traced_micro_batch_that_stays_finite_says_so(tmp_path, run_here):
    (tmp_path / "anneals.py").write_text(ANNEALS)
    done, _, stderr = run_here("python", "anneals.py", options=("--trace-at", "2"))
    assert done.code == 1 and done.first["step"] == 3 and done.first["detected_by"] == "watch", done.output
    assert "step 2, micro-batch 1 ran under the tracer and no NaN/Inf reached its loss or gradients" in stderr


def test_a_step_that_is_not_one_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(main, ["run", "--trace-at", "0:1", "--", "python", str(Path(tmp_path) / "x.py")])
    assert result.exit_code == 2 and "give the step and micro-batch the log named" in result.output
