"""--checkpoint: a run resumed from a checkpoint saved by a plain PyTorch loop reaches the plain loop's NaN at the
same step number; a task's own loader, the built-in pipeline's weights; bad checkpoints exit 2 naming what is
wrong."""

import argparse
import math
from pathlib import Path

import pytest
import torch

from debug_nan.drivers.trainer.checkpoint import load_model_state
from tests.support.tasks import resume_task

TASK = Path(resume_task.__file__)
K = 20  # the plain loop saves its checkpoint after this many optimizer steps


def args(name: str = "build", *more: str) -> list[str]:
    return ["--task", f"{TASK}:{name}", "--device", "cpu", "--no-bundle", *more]


def plain_run(tmp_path: Path, layout, ranks: int = 1) -> tuple[Path, int]:
    """Train the task in plain PyTorch, save `layout(model, optimizer, step)` after step K, and go on to the first
    non-finite loss -> (checkpoint path, the step of that loss). ranks=2: what two DDP ranks do, in one process:
    step s deals micro-batch 2(s-1) to rank 0 and 2(s-1)+1 to rank 1 (drivers/task.py: micro-batch i goes to rank
    i % 2) and averages their gradients; the first step where either rank's loss is not finite."""
    t = resume_task.build()
    model, optimizer, batches = t["model"], t["optimizer"](t["model"].parameters()), t["batches"]
    path = tmp_path / "ckpt.pt"
    for step in range(1, 200):
        losses = [t["loss"](model, batches[(ranks * (step - 1) + r) % len(batches)]) for r in range(ranks)]
        if not all(math.isfinite(loss.item()) for loss in losses):
            return path, step
        optimizer.zero_grad()
        (sum(losses) / ranks).backward()
        optimizer.step()
        if step == K:
            torch.save(layout(model, optimizer, step), path)
    raise AssertionError("the plain loop never went non-finite")


def usual(model, optimizer, step):
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}


def lightning_like(model, optimizer, step):
    """Lightning's layout: the module's keys under `model.`, a list of optimizer states, global_step."""
    return {"state_dict": {f"model.{k}": v for k, v in model.state_dict().items()},
            "optimizer_states": [optimizer.state_dict()], "global_step": step, "epoch": 0}


def ddp_saved(model, optimizer, step):
    return {"model_state_dict": {f"module.{k}": v for k, v in model.state_dict().items()},
            "optimizer_state_dict": optimizer.state_dict(), "global_step": step}


@pytest.mark.parametrize("layout", [usual, lightning_like, ddp_saved])
def test_resume_reaches_the_plain_loops_nan_at_the_same_step(run_cli, tmp_path, layout):
    path, nan_step = plain_run(tmp_path, layout)
    assert nan_step > K + 5  # the NaN is well after the checkpoint
    # 25 steps: only a run that really continues from step K (weights and momentum) gets there
    run = run_cli(*args("build", "--checkpoint", str(path), "--skip-batches", str(K), "--max-steps", "25"))
    assert run.code == 1, run.output
    assert run.first["step"] == nan_step
    assert run.first["phase"] == "loss" and run.first["cause"] == "log_of_nonpositive"
    assert run.report["steps_run"] == nan_step - K
    assert f"the run continues at step {K + 1}" in run.output
    assert f"STEP {nan_step}/" in run.output
    fresh = run_cli(*args("build", "--max-steps", "25"))
    assert fresh.code == 0, fresh.output  # from scratch, 25 steps stay finite


def test_a_tasks_own_load_checkpoint(run_cli, tmp_path):
    path, nan_step = plain_run(tmp_path, lambda m, o, s: {"weights": m.state_dict(), "opt": o.state_dict(), "n": s})
    run = run_cli(*args("build_custom", "--checkpoint", str(path), "--skip-batches", str(K), "--max-steps", "25"))
    assert run.code == 1, run.output
    assert run.first["step"] == nan_step
    plain = run_cli(*args("build", "--checkpoint", str(path)))
    assert plain.code == 2 and "without model weights" in plain.output and "its keys: n, opt, weights" in plain.output


def test_without_optimizer_state_the_trajectory_differs_and_is_said(run_cli, tmp_path):
    path, nan_step = plain_run(tmp_path, lambda m, o, s: {"model": m.state_dict(), "step": s})
    run = run_cli(*args("build", "--checkpoint", str(path), "--skip-batches", str(K), "--max-steps", "40"))
    assert "no optimizer state in the checkpoint" in run.output
    assert run.code == 1 and run.first["step"] != nan_step  # momentum restarted at zero: a later NaN


# -- bad checkpoints: exit 2, naming what is wrong -------------------------------------------------------------------
def save(tmp_path: Path, obj, name: str = "bad.pt") -> str:
    path = tmp_path / name
    torch.save(obj, path)
    return str(path)


def test_wrong_keys_exit_2_with_names_and_counts(run_cli, tmp_path):
    path = save(tmp_path, {"model": {"encoder.weight": torch.zeros(1, 1), "encoder.bias": torch.zeros(1)}})
    run = run_cli(*args("build", "--checkpoint", path))
    assert run.code == 2
    assert "1 of the model's 1 keys missing from the checkpoint: `weight`" in run.output
    assert "2 checkpoint keys the model does not have: `encoder.weight`, `encoder.bias`" in run.output
    assert "--checkpoint-non-strict" in run.output
    assert run.report["status"] == "error"


def test_non_strict_loads_what_fits_and_names_the_rest(run_cli, tmp_path):
    path = save(tmp_path, {"weight": torch.full((1, 1), 0.3), "extra.weight": torch.zeros(2)})
    run = run_cli(*args("build", "--checkpoint", path, "--checkpoint-non-strict", "--max-steps", "1"))
    assert run.code == 0, run.output
    assert "1 checkpoint keys ignored: `extra.weight`" in run.output
    model = resume_task.make_model()
    notes = load_model_state(model, {"weight": torch.full((1, 1), 0.3), "x": torch.zeros(1)}, "p", strict=False)
    assert model.weight.item() == pytest.approx(0.3) and notes == ["--checkpoint-non-strict: 1 checkpoint keys "
                                                                   "ignored: `x`"]


def test_wrong_shapes_exit_2_even_non_strict(run_cli, tmp_path):
    path = save(tmp_path, {"model": {"weight": torch.zeros(3, 2)}, "step": 4})
    for extra in ([], ["--checkpoint-non-strict"]):
        run = run_cli(*args("build", "--checkpoint", path, *extra))
        assert run.code == 2
        assert "1 of shape different from the model's: weight [3, 2] vs the model's [1, 1]" in run.output


def test_not_a_checkpoint_missing_file_and_a_folder(run_cli, tmp_path):
    text = tmp_path / "notes.txt"
    text.write_text("not a checkpoint\n")
    run = run_cli(*args("build", "--checkpoint", str(text)))
    assert run.code == 2 and f"--checkpoint {text} is not a PyTorch checkpoint" in run.output
    run = run_cli(*args("build", "--checkpoint", str(tmp_path / "nope.pt")))
    assert run.code == 2 and "does not exist" in run.output
    run = run_cli(*args("build", "--checkpoint", str(tmp_path)))
    assert run.code == 2 and "is a directory" in run.output  # click answers before the job starts
    run = run_cli(*args("build", "--checkpoint", save(tmp_path, [1, 2, 3])))
    assert run.code == 2 and "holds a list, not a state_dict" in run.output


def test_weights_only_refusal_is_explained_and_unsafe_load_opts_out(run_cli, tmp_path):
    model = resume_task.make_model()
    path = save(tmp_path, {"model": model.state_dict(), "args": argparse.Namespace(lr=0.1), "step": 3})
    run = run_cli(*args("build", "--checkpoint", path, "--max-steps", "1"))
    assert run.code == 2
    assert "torch.load(weights_only=True) refused it" in run.output and "--checkpoint-unsafe-load" in run.output
    run = run_cli(*args("build", "--checkpoint", path, "--checkpoint-unsafe-load", "--max-steps", "1"))
    assert run.code == 0, run.output
    assert "STEP 4/" in run.output


def test_optimizer_state_of_another_optimizer_exit_2(run_cli, tmp_path):
    model = resume_task.make_model()
    other = torch.optim.SGD([model.weight, torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    path = save(tmp_path, {"model": model.state_dict(), "optimizer": other.state_dict()})
    run = run_cli(*args("build", "--checkpoint", path))
    assert run.code == 2 and "its optimizer state does not fit the run's optimizer (SGD)" in run.output


def test_the_built_in_pipeline_resumes_from_its_own_weights(run_cli, tmp_path):
    from debug_nan.aam.model.aam import AAMConfig, AAMModel
    from debug_nan.app.job_settings import build_settings
    from tests.conftest import TINY

    model = AAMModel(AAMConfig.from_settings(build_settings(TINY, {}).aam))
    torch.nn.init.constant_(model.unifrac_head.proj.bias, 0.25)
    path = save(tmp_path, {"model": model.state_dict(), "epoch": 3}, "aam.pt")
    run = run_cli("--config", TINY, "--checkpoint", path, "--max-steps", "1", "--device", "cpu")
    assert run.code == 0, run.output
    assert "loaded model; the run continues at step 1" in run.output
    assert "records epoch 3 but no step counter" in run.output
    wrong = run_cli("--config", TINY, "--checkpoint", path, "--d-model", "64", "--device", "cpu")
    assert wrong.code == 2 and "of shape different from the model's" in wrong.output
