"""`debug-nan run` on an fp16 loop with a GradScaler (CPU autocast): its overflow steps are probed (their backward
replayed at scale 1), skipped as usual and told in one line per run of them, not findings; a NaN loss after them
is."""

from tests.support.run.script_runs import same_as_alone, write

SCALER = """import torch
from tests.support import models

torch.manual_seed(0)
model = models.Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 40)  # scaled gradients overflow float16 at first
for batch in models.batches(labels=True, empty_at=(5,)):
    with torch.autocast("cpu", dtype=torch.float16):
        loss = models.regression_loss(model, batch)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    print(scaler.get_scale())
"""


def test_scaler_overflow_steps_are_skipped_and_the_nan_after_them_is_found(tmp_path, run_here):
    (tmp_path / "scaler.py").write_text(SCALER)
    done, stdout, stderr = run_here("python", "scaler.py")
    assert done.code == 1, done.output
    assert stdout.split() == [str(2.0 ** k) for k in range(39, 34, -1)]  # halved 5 times: 5 skipped steps
    assert stderr.count("skipped by the GradScaler:") == 1
    assert "steps 1-5 skipped by the GradScaler: scale 1.1e12 -> 3.4e10" in stderr
    assert [h["scaler_skipped"] for h in done.report["history"]] == [True] * 5 + [False]
    first = done.first
    assert (first["step"], first["micro_step"], first["phase"], first["module"], first["op"], first["cause"]) == (
        6, 1, "forward", "attn", "aten._softmax.default", "all_masked_softmax")


# bf16 autocast with a GradScaler whose initial scale is far too high: the scaled loss is past float32's range at
# every step (by design: only the gradients' overflow matters to the scaler), and the first steps' gradients
# overflow and are skipped while the scale comes down. `python bf16.py N` weights every sample out at step N.
BF16 = """import sys

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127)
broken = int(sys.argv[1]) if len(sys.argv) > 1 else 0
for step in range(1, 9):
    x, y = torch.randn(8, 4), 30 * torch.randn(8)
    weights = torch.zeros(8) if step == broken else torch.ones(8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pred = model(x).squeeze(-1).float()
    loss = ((pred - y).pow(2) * weights).sum() / weights.sum()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    print(f"step {step} scale {scaler.get_scale():g}")
"""


def test_a_scale_too_high_for_float32_is_the_scalers_business_not_a_finding(tmp_path, run_here):
    """Steps 1, 2, 3 and 5 overflow and are skipped as the scale comes down: the run is clean and its output the
    plain run's, byte for byte."""
    script = write(tmp_path, BF16, "bf16.py")
    done, stdout, stderr = same_as_alone(run_here, script)
    assert done.report["status"] == "clean" and done.report["steps_run"] == 8
    assert [h["scaler_skipped"] for h in done.report["history"]] == [True, True, True, False, True, False, False,
                                                                      False]
    assert stderr.count("skipped by the GradScaler:") == 2 and stdout.count("\n") == 8
    assert "steps 1-3 skipped by the GradScaler: scale 1.7e38 -> 2.1e37" in stderr
    assert "step 5 skipped by the GradScaler: scale 2.1e37 -> 1.1e37" in stderr
    assert "4 of 8 step(s) skipped by the GradScaler (steps 1..3, 5)" in stderr


def test_a_nan_loss_once_the_scale_came_down_is_found(tmp_path, run_here):
    (tmp_path / "bf16.py").write_text(BF16)
    done, stdout, _ = run_here("python", "bf16.py", "6")
    assert done.code == 1, done.output
    first = done.first
    assert (first["step"], first["micro_step"], first["phase"], first["op"], first["cause"], first["source"]) == (
        6, 1, "loss", "aten.div.Tensor", "div_by_zero", "bf16.py:16")
    assert stdout.count("\n") == 5
