"""The eval pass (drivers/trainer/evaluate.py): the model comes back in its training flags and the watch with it,
and the harmed values of what eval functions return. (Through the CLI: tests/e2e/cli/test_eval.py.)"""

from pathlib import Path

import torch

from debug_nan.drivers.task import load_task
from debug_nan.drivers.trainer.evaluate import harmed_values
from debug_nan.drivers.trainer.loop import Trainer
from debug_nan.app.job_settings import JobSettings
from tests.support.tasks import eval_task

TASK = Path(eval_task.__file__)


def test_the_pass_restores_training_flags_and_the_watch():
    s = JobSettings.from_flat(dict(task=f"{TASK}:post_norm", device="cpu", eval_every=1, max_steps=1))
    trainer = Trainer(load_task(s.train.task, s.for_task()), s, lambda *a, **k: None)
    flags = {n: m.training for n, m in trainer.model.named_modules()}
    assert flags["frozen"] is False and flags[""] is True
    hooks = len(trainer.watch._handles)
    assert trainer.evaluation.run(1) is None
    assert {n: m.training for n, m in trainer.model.named_modules()} == flags
    assert len(trainer.watch._handles) == hooks > 0


def test_harmed_values_of_what_eval_functions_return():
    named = harmed_values({"loss": torch.tensor(1.0), "acc": 0.5, "pred": torch.ones(2, 3), "ids": torch.arange(3),
                           "name": "x"})
    assert [n for n, _ in named] == ["loss", "acc", "pred"]
    assert harmed_values(2.0)[0][0] == "loss" and harmed_values(torch.tensor(3.0))[0][0] == "loss"
