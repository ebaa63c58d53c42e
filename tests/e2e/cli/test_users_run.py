"""The debug run is the user's run (through the CLI): nothing added to a task's recipe, the task's own schedule and
clipping honoured, training mode set once (frozen parts stay frozen), the batch replayed as produced, a compiled
model debugged through its eager module. Each run is compared with the same training in plain PyTorch."""

import math
from pathlib import Path

import pytest
import torch

from tests.conftest import TINY
from tests.support.tasks import users_run

TASKS = Path(users_run.__file__)


def task(name: str) -> list[str]:
    return ["--task", f"{TASKS}:{name}", "--device", "cpu"]


def plain_losses(factory, steps: int, clip: float | None = None, schedule: bool = False) -> list[float]:
    """The task trained in plain PyTorch: the loss of each step, until it is non-finite (included)."""
    t = factory()
    optimizer = t.optimizer(list(t.model.parameters()))
    scheduler = t.scheduler(optimizer) if schedule else None
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = t.loss(t.model, t.batches[step % len(t.batches)])
        losses.append(loss.item())
        if not math.isfinite(losses[-1]):
            break
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(t.model.parameters(), clip)
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    return losses


def test_sgd_at_lr_5_diverges_at_the_step_plain_pytorch_does(run_cli):
    plain = plain_losses(users_run.sgd_lr5, 40)
    first_bad = len(plain)  # 1-based step of the first non-finite loss
    assert not math.isfinite(plain[-1]) and first_bad > 5
    run = run_cli(*task("sgd_lr5"), "--max-steps", str(first_bad + 2), "--explosion-threshold", "1e300")
    assert run.code == 1, run.output
    f = run.first
    assert (f["step"], f["phase"], f["kind"]) == (first_bad, "loss", "inf")
    ran = [h["loss"] for h in run.report["history"][:first_bad - 1]]
    assert ran == pytest.approx(plain[:first_bad - 1], rel=1e-5)  # the same run, step by step
    assert run.report["recipe"] == {"optimizer": "SGD", "lr": 5.0, "scheduler": None, "max_grad_norm": None,
                                    "from": {"optimizer": "the task's"}}
    assert "optimizer SGD (lr 5) (the task's) | no clipping | constant lr" in run.output


def test_sgd_at_lr_5_explosion_is_caught_on_the_plain_gradient_norms(run_cli):
    run = run_cli(*task("sgd_lr5"), "--max-steps", "10")
    f = run.first
    assert run.code == 1 and f["cause"] == "gradient_explosion" and f["step"] == 4
    norms = [h["grad_norm"] for h in run.report["history"]]
    assert norms[:2] == pytest.approx([2.4038, 53.556], rel=1e-3)  # unclipped, as plain PyTorch computes them


def test_the_tasks_schedule_and_clipping_are_honoured(run_cli):
    t = users_run.scheduled_and_clipped()
    plain = plain_losses(users_run.scheduled_and_clipped, 3, clip=t.max_grad_norm, schedule=True)
    run = run_cli(*task("scheduled_and_clipped"), "--max-steps", "3")
    assert run.code == 0, run.output
    history = run.report["history"]
    assert [h["lr"] for h in history] == pytest.approx([0.1, 0.05, 0.025])
    assert [h["loss"] for h in history] == pytest.approx(plain, rel=1e-5)
    assert run.report["recipe"]["max_grad_norm"] == 0.5 and run.report["recipe"]["scheduler"] == "StepLR"
    assert "(clipped to 0.5)" in run.output and "clip 0.5 (the task's)" in run.output


def test_an_explicit_flag_replaces_the_tasks_clipping(run_cli):
    plain = plain_losses(users_run.scheduled_and_clipped, 3, clip=None, schedule=True)
    run = run_cli(*task("scheduled_and_clipped"), "--max-steps", "3", "--max-grad-norm", "0")
    assert [h["loss"] for h in run.report["history"]] == pytest.approx(plain, rel=1e-5)
    assert run.report["recipe"]["max_grad_norm"] is None and "clipped to" not in run.output


def test_the_builtin_pipeline_keeps_its_own_warmup_and_clipping(run_cli):
    run = run_cli("--config", TINY, "--max-steps", "2", "--device", "cpu")
    assert run.code == 0
    assert [h["lr"] for h in run.report["history"]] == pytest.approx([5e-4, 1e-3])  # warmup 2 at lr 1e-3
    assert run.report["recipe"]["max_grad_norm"] == 1.0 and run.report["recipe"]["scheduler"] == "LambdaLR"


@pytest.mark.parametrize("name", ["frozen_batchnorm", "frozen_batchnorm_by_train"])
def test_a_frozen_eval_mode_submodule_stays_frozen_and_is_found(run_cli, name):
    model = getattr(users_run, name)().model
    model.train()  # what a training loop does: BatchNorm stays in eval where the task froze it
    if name == "frozen_batchnorm":
        model.bn.eval()
    with torch.no_grad():
        assert not torch.isfinite(model(users_run._regression(14)[0]["x"])).all()  # non-finite for the user
    run = run_cli(*task(name), "--max-steps", "3")
    assert run.code == 1, run.output
    f = run.first
    assert (f["step"], f["micro_step"], f["phase"], f["module"], f["module_type"]) == \
        (1, 1, "forward", "bn", "BatchNorm1d")
    assert "kept in eval mode, as the task left them: bn" in run.output


def test_a_loss_that_changes_its_batch_in_place_replays_on_the_original_data(run_cli):
    run = run_cli(*task("mutating_loss"), "--max-steps", "2")
    assert run.code == 1, run.output
    f = run.first
    assert (f["step"], f["phase"], f["module"]) == (1, "loss", "")
    assert (f["op"], f["kind"], f["cause"]) == ("aten.div_.Tensor", "nan", "div_by_zero")
    line = _line_of('batch["w"].div_(')
    assert "div_" in f["source_line"] and f["source"].endswith(f"users_run.py:{line}")
    assert f["inputs"]["self"]["nan"] == 0  # the replay's input is the batch as produced, not the mutated one


def test_a_compiled_model_that_is_healthy_runs_clean(run_cli):
    run = run_cli(*task("compiled_healthy"), "--max-steps", "2")
    assert run.code == 0, run.output
    assert "torch.compile'd; debugging the eager module underneath" in run.output


def test_a_compiled_model_that_breaks_is_pinpointed(run_cli):
    run = run_cli(*task("compiled_broken"), "--max-steps", "2")
    assert run.code == 1, run.output
    f = run.first
    assert (f["module"], f["module_type"], f["op"], f["cause"]) == \
        ("attn", "MaskedAttention", "aten._softmax.default", "all_masked_softmax")


def _line_of(fragment: str) -> int:
    lines = TASKS.read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if fragment in line)
