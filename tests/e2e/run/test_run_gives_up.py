"""A script that gives up on a micro-batch itself (its own NaN check raises and its CLI exits 1, as the real AAM
does; or it exits mid-step) is still watched: a NaN/Inf born before it gave up is the finding, replayed in place as
far as the run got; a script that stops mid-step for reasons of its own keeps its exit code and a clean report."""

GIVES_UP = """import sys
import torch
from torch import nn


class Encoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x, valid):
        scores = self.proj(x).masked_fill(~valid, float("-inf"))
        out = torch.softmax(scores, dim=-1)
        if torch.isnan(out).any():  # the model's own NaN check
            print("encoder: NaN found")  # (the replay runs this forward again: printed once all the same)
            raise ValueError("NaN in the encoder output")
        return out


def main():
    torch.manual_seed(0)
    model = Encoder()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(1, 5):
        x, valid = torch.randn(3, 4), torch.ones(3, 4, dtype=torch.bool)
        if step == STEP:
            valid[1] = False
        try:
            out = model(x, valid)
        except ValueError as exc:  # the CLI catches its own error and exits 1
            print(f"error: {exc}")
            return 1
        if step == QUIT:
            print("out of time budget")
            return 3
        out.pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step}")
    return 0


sys.exit(main())
"""


def test_a_script_that_catches_its_own_nan_and_exits_1_is_not_clean(tmp_path, run_here):
    (tmp_path / "gives_up.py").write_text(GIVES_UP.replace("STEP", "3").replace("QUIT", "0"))
    done, stdout, stderr = run_here("python", "gives_up.py")
    assert done.code == 1 and done.report["status"] == "nonfinite", done.output
    first = done.first
    assert (first["step"], first["micro_step"], first["phase"], first["op"], first["cause"], first["source"]) == (
        3, 1, "forward", "aten._softmax.default", "all_masked_softmax", "gives_up.py:13")
    assert "ScriptGaveUp: the command exited with code 1" in first["exception"]
    assert stdout == "step 1\nstep 2\nencoder: NaN found\nerror: NaN in the encoder output\n"  # as it was
    assert "the command ended (exit 1) in step 3, micro-batch 1 before its backward()" in " ".join(stderr.split())


def test_a_script_that_stops_mid_step_for_its_own_reasons_keeps_its_code(tmp_path, run_here):
    (tmp_path / "quits.py").write_text(GIVES_UP.replace("STEP", "0").replace("QUIT", "2"))
    done, stdout, stderr = run_here("python", "quits.py")
    assert done.code == 3 and done.report["status"] == "clean", done.output
    assert stdout == "step 1\nout of time budget\n"
    assert "no NaN/Inf was born in step 2, micro-batch 1 before the command ended: its exit is its own" in " ".join(
        stderr.split())


SKIPS = """import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(3)
for step in range(1, 8):
    x = torch.randn(16, 4, generator=g)
    if step == 4:
        x[2, 1] = float("nan")  # a corrupt sample
    loss = model(x).pow(2).mean()
    if not torch.isfinite(loss):  # the script's own guard: skip the batch
        print(f"skipping batch {step}")
        continue
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
"""


def test_a_nan_output_the_script_skips_with_continue_is_found(tmp_path, run_here):
    """The guard skips the batch and the next forward opens no new micro-batch (no backward came): at the next
    backward the tape shows the skipped forward's outputs were never used, and they held NaN."""
    (tmp_path / "skips.py").write_text(SKIPS)
    done, stdout, stderr = run_here("python", "skips.py")
    assert done.code == 1, done.output
    first = done.first
    assert (first["step"], first["micro_step"], first["phase"], first["cause"]) == (4, 1, "data", "nonfinite_input")
    assert "skipping batch 4" in stdout and "step 5" not in stdout
    assert "made a model output holding nan that no backward took" in " ".join(stderr.split())
