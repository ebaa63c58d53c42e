"""A loop with no torch.optim optimizer (the weights updated by hand, as pytorch/examples' word language model
does: `p.data.add_(p.grad, alpha=-lr)`) is watched too: the model is the module that owns the parameters its
first backward reaches, a step ends at the next forward (where its update is checked), and an update that made a
weight non-finite is named at the script's own line."""

from tests.support.run.script_runs import same_as_alone

BY_HAND = """import sys
import torch
from torch import nn
import torch.nn.functional as F

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
lr, bad_step = 0.1, int(sys.argv[1])
g = torch.Generator().manual_seed(1)
for step in range(1, 7):
    x, y = torch.randn(32, 8, generator=g), torch.randint(0, 4, (32,), generator=g)
    loss = F.cross_entropy(model(x), y)
    model.zero_grad()
    loss.backward()
    step_lr = lr * float("inf") if step == bad_step else lr  # a schedule gone wrong
    for p in model.parameters():
        p.data.add_(p.grad, alpha=-step_lr)
    print(f"step {step} loss {loss.item():.4f}")
"""


def test_a_healthy_hand_written_update_runs_as_it_does_alone(tmp_path, run_here):
    (tmp_path / "by_hand.py").write_text(BY_HAND)
    done, stdout, stderr = same_as_alone(run_here, tmp_path / "by_hand.py", "0")
    assert stdout.count("\n") == 6
    assert (done.report["status"], done.report["steps_run"]) == ("clean", 6)
    assert "updates itself (no torch.optim optimizer)" in " ".join(stderr.split())


def test_a_hand_written_update_that_makes_a_weight_infinite_is_named_at_its_line(tmp_path, run_here):
    (tmp_path / "by_hand.py").write_text(BY_HAND)
    done, stdout, _ = run_here("python", "by_hand.py", "4")
    assert done.code == 1, done.output
    first = done.first
    assert (first["step"], first["phase"], first["op"], first["cause"], first["source"]) == (
        4, "optimizer", "aten.add_.Tensor", "nonfinite_parameter", "by_hand.py:17")
    assert "the step size the loop computed is not finite" in first["explanation"]
    assert stdout.count("\n") == 4  # the script's step 4 printed; its step 5 forward is where the update was read


# the same loop, validating after every update as the word language model does at each epoch's end
WITH_VALIDATION = BY_HAND.replace('''    print(f"step {step} loss {loss.item():.4f}")''', '''    with torch.no_grad():
        val = sum(F.cross_entropy(model(torch.randn(64, 8, generator=g)), torch.zeros(64, dtype=torch.long))
                  for _ in range(3)) / 3
    print(f"step {step} loss {loss.item():.4f} val {val.item():.4f}")''')


def test_a_hand_written_update_followed_by_validation_is_checked_before_the_validation_uses_it(tmp_path, run_here):
    """Its step ends at the validation's first forward (not at the next training forward): the update that made
    a weight infinite is still the finding, at the loop's own line, before a validation loss reads inf."""
    (tmp_path / "by_hand.py").write_text(WITH_VALIDATION)
    done, stdout, _ = same_as_alone(run_here, tmp_path / "by_hand.py", "0")
    assert (done.report["status"], done.report["steps_run"]) == ("clean", 6) and stdout.count(" val ") == 6
    done, stdout, _ = run_here("python", "by_hand.py", "4")
    first = done.first
    assert done.code == 1 and (first["step"], first["phase"], first["cause"], first["source"]) == (
        4, "optimizer", "nonfinite_parameter", "by_hand.py:17"), done.output
