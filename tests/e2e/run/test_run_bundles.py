"""A `debug-nan run` finding writes a repro bundle that `debug-nan replay` replays with no script at hand: the
script's model (its class in the script's `__main__`, its forward calling a module beside the script), optimizer,
LR scheduler and the recorded code around the model travel in the bundle (drivers/run/bundle.py). Each replay
is made in another folder, the script and its module deleted, and must name the run's op, line and cause."""

import json
import shutil

import pytest
import torch
from click.testing import CliRunner

from debug_nan import torch_support
from debug_nan.app.cli import main
from tests.e2e.run.test_run_in_place import CONTRASTIVE, PENALTY
from tests.support.bundles import load
from tests.support.run.script_runs import tripped

# the model's class lives in the script; its activation in a module beside it; a scheduler with a lambda
SOFTMAX_BY_HAND = """import torch
from torch import nn

import helper


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x):
        return self.b(helper.act(self.a(x)))


torch.manual_seed(0)
model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
for step in range(1, 7):
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    p = model(x).softmax(-1)
    if step == 4:
        p = p - 1.0  # a bug in the loss code: probabilities below 0
    loss = -p.log().gather(1, y[:, None]).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    schedule.step()
    print(f"step {step} loss {loss.item():.4f}")
"""

HELPER = """import torch


def act(x):
    return torch.tanh(x) * 2
"""

# two micro-batches per step, clipping, then a learning rate the loop sets to inf: the update is the origin
UPDATE = """import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for step in range(1, 6):
    for micro in range(2):
        x, y = torch.randn(5, 4), torch.randn(5, 1)
        loss = ((model(x) - y) ** 2).mean() / 2
        loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    if step == 4:
        optimizer.param_groups[0]["lr"] = float("inf")
    optimizer.step()
    optimizer.zero_grad()
"""

pytestmark = pytest.mark.skipif(bool(torch_support.save_options()), reason="torch < 2.6 on Python 3.13 writes no "
                                "`run` bundle (tests/unit/drivers/run/test_bundle.py)")

KEYS = ("step", "micro_step", "phase", "module", "op", "cause", "source")


def replay_elsewhere(tmp_path, bundle: str, *scripts: str) -> tuple[int, str, dict]:
    """Move the bundle to a new folder, delete the script's files, replay there -> (exit code, output, report)."""
    away = tmp_path / "elsewhere"
    away.mkdir()
    moved = away / bundle.rsplit("/", 1)[-1]
    shutil.move(bundle, moved)
    for name in scripts:
        (tmp_path / name).unlink()
    report = away / "replay.json"
    result = CliRunner().invoke(main, ["replay", str(moved), "--device", "cpu", "--report", str(report)],
                                catch_exceptions=False)
    return result.exit_code, result.output, json.loads(report.read_text())


def test_a_loss_code_bug_replays_from_the_bundle_without_the_script(tmp_path, run_here):
    (tmp_path / "train.py").write_text(SOFTMAX_BY_HAND)
    (tmp_path / "helper.py").write_text(HELPER)
    done, _, stderr = run_here("python", "train.py")
    assert done.code == 1, done.output
    first = done.first
    assert (first["step"], first["phase"], first["op"], first["cause"], first["source"]) == (
        4, "loss", "aten.log.default", "log_of_nonpositive", "train.py:25")
    bundle = first["bundle"]
    assert bundle == "debug-nan-bundle-step4-micro1.pt"  # (shown from the folder debug-nan started in)
    assert (tmp_path / bundle).is_file() and "[bundle] repro bundle written: debug-nan-bundle-step4" in stderr
    code, output, report = replay_elsewhere(tmp_path, bundle, "train.py", "helper.py")
    assert code == 1, output
    replayed = report["first_nonfinite"]
    assert {k: replayed[k] for k in KEYS if k != "source"} == {k: first[k] for k in KEYS if k != "source"}
    assert replayed["source"].endswith("train.py:25")
    assert "Same origin as recorded in the bundle." in report["notes"]


def test_an_update_replays_with_its_clipping_and_the_loops_learning_rate(tmp_path, run_here):
    first, _, _ = tripped(run_here, tmp_path, UPDATE, "update.py")
    assert (first["step"], first["micro_step"], first["phase"], first["source"]) == (4, 2, "optimizer", "update.py:15")
    code, output, report = replay_elsewhere(tmp_path, first["bundle"], "update.py")
    assert code == 1, output
    assert {k: report["first_nonfinite"][k] for k in KEYS[:5]} == {k: first[k] for k in KEYS[:5]}


def test_a_gradient_penalty_and_a_contrastive_pair_replay_from_their_bundles(tmp_path, run_here):
    for name, source, phase in (("penalty.py", PENALTY, "backward"), ("contrastive.py", CONTRASTIVE, "loss")):
        folder = tmp_path / name[:-3]
        folder.mkdir()
        (folder / name).write_text(source)
        done, _, _ = run_here("python", str(folder / name), options=("--bundle-dir", str(folder / "bundles")))
        assert done.code == 1 and done.first["phase"] == phase, done.output
        assert done.first["bundle"].startswith(f"{folder.name}/bundles/debug-nan-bundle-step3-micro1")
        code, output, report = replay_elsewhere(folder, done.first["bundle"], name)
        assert code == 1, output
        assert {k: report["first_nonfinite"][k] for k in KEYS[:6]} == {k: done.first[k] for k in KEYS[:6]}


def test_no_bundle_writes_none_and_the_finding_stands(tmp_path, run_here):
    (tmp_path / "update.py").write_text(UPDATE)
    done, _, stderr = run_here("python", "update.py", options=("--no-bundle",))
    assert done.code == 1 and done.first["bundle"] is None, done.output
    assert not list(tmp_path.glob("debug-nan-bundle-*")) and "[bundle]" not in stderr


def test_a_bundle_holds_the_state_at_the_failing_steps_start(tmp_path, run_here):
    """The model in the bundle is the run's at step 4's start: replaying the 3 finite steps by hand from a fresh
    model gives the same parameters."""
    (tmp_path / "update.py").write_text(UPDATE)
    done, _, _ = run_here("python", "update.py")
    bundle = load(done.first["bundle"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for _ in range(3):
        for _ in range(2):
            x, y = torch.randn(5, 4), torch.randn(5, 1)
            (((model(x) - y) ** 2).mean() / 2).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
    saved = bundle["script"]["model"].state_dict()
    assert all(torch.equal(saved[k], v) for k, v in model.state_dict().items())
    assert bundle["script"]["optimizer"].param_groups[0]["lr"] == 0.1  # the step's start, not the loop's inf
