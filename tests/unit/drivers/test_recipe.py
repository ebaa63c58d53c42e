"""What the run trains with: the task's optimizer, schedule and clipping, explicit settings over them, nothing
added; training mode set once with frozen parts kept; the Trainer as the pinpointer's StepDriver."""

import io

import pytest
import torch
from torch import nn

from debug_nan.drivers.recipe import build_recipe, enter_training_mode
from debug_nan.drivers.task import Task
from debug_nan.drivers.trainer.loop import Trainer
from debug_nan.engine.replay.driver import StepDriver
from debug_nan.errors import InputError
from debug_nan.presentation.log import Log
from debug_nan.settings import RunSettings, TrainSettings


def task(**kw) -> Task:
    return Task(model=nn.Linear(2, 1), batches=[{"x": torch.ones(3, 2)}], loss=lambda m, b: m(b["x"]).sum(),
                spec="t.py:t", **kw)


def recipe(t: Task, **settings):
    lines = []
    r = build_recipe(t, TrainSettings(**settings), list(t.model.parameters()), lines.append)
    return r, lines


def test_a_task_without_a_recipe_gets_adamw_and_nothing_else():
    r, _ = recipe(task(), lr=3e-3)
    assert type(r.optimizer) is torch.optim.AdamW and r.lr() == 3e-3
    assert r.scheduler is None and r.max_grad_norm is None
    assert r.line() == "optimizer AdamW (lr 0.003) (--lr, --weight-decay) | no clipping | constant lr"


def test_the_tasks_own_recipe():
    t = task(optimizer=lambda p: torch.optim.SGD(p, lr=0.5), max_grad_norm=2.0,
             scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.1))
    r, _ = recipe(t, lr=123.0)  # --lr belongs to the default optimizer only
    assert type(r.optimizer) is torch.optim.SGD and r.lr() == 0.5 and r.max_grad_norm == 2.0
    assert type(r.scheduler).__name__ == "StepLR"
    assert r.describe() == {"optimizer": "SGD", "lr": 0.5, "scheduler": "StepLR", "max_grad_norm": 2.0,
                            "from": {"optimizer": "the task's", "scheduler": "the task's",
                                     "max_grad_norm": "the task's"}}


def test_explicit_settings_replace_the_tasks_own():
    t = task(max_grad_norm=2.0, scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 1))
    r, lines = recipe(t, max_grad_norm=0.0, warmup_steps=4)
    assert r.max_grad_norm is None and type(r.scheduler).__name__ == "LambdaLR"
    assert r.optimizer.param_groups[0]["lr"] == pytest.approx(1e-4 / 4)  # the warmup's first step
    assert any("--warmup-steps 4 replaces the task's own scheduler" in line for line in lines)


@pytest.mark.parametrize("kw, message", [
    ({"optimizer": lambda p: "sgd"}, "must return a torch.optim.Optimizer, got str"),
    ({"optimizer": lambda p: 1 / 0}, "optimizer(params) raised ZeroDivisionError"),
    ({"scheduler": lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o)}, "ReduceLROnPlateau"),
    ({"scheduler": lambda o: object()}, "must return an LR scheduler (with step, state_dict, load_state_dict)"),
])
def test_a_bad_recipe_is_bad_input(kw, message):
    with pytest.raises(InputError) as info:
        recipe(task(**kw))
    assert message in str(info.value) and "t.py:t" in str(info.value)


class Frozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5))
        self.bn = nn.BatchNorm1d(2)
        self.head = nn.Linear(2, 1)


def test_training_mode_once_keeps_what_the_task_froze():
    model = Frozen()
    model.enc.eval()
    assert enter_training_mode(model) == ["enc"]
    assert model.training and model.head.training and model.bn.training
    assert not model.enc.training and not model.enc[1].training


def test_a_model_handed_over_in_eval_mode_is_put_in_training_mode():
    model = Frozen().eval()
    assert enter_training_mode(model) == [] and all(m.training for m in model.modules())




def test_the_trainer_is_a_step_driver_and_never_calls_train_per_forward():
    model = Frozen()
    calls = []
    t = Task(model=model, batches=[{"x": torch.ones(4, 2)}], name="t",
             loss=lambda m, b: (calls.append([x.training for x in m.modules()]), m.head(m.bn(m.enc(b["x"]))).sum())[1])
    model.bn.eval()
    trainer = Trainer(t, RunSettings(TrainSettings(device="cpu", max_steps=2)), Log(stream=io.StringIO()))
    assert isinstance(trainer, StepDriver)
    assert trainer.run().status == "clean"
    bn = [i for i, m in enumerate(model.modules()) if m is model.bn][0]
    assert len(calls) == 2 and not any(c[bn] for c in calls)  # the frozen BatchNorm stayed in eval mode


def test_clipping_reuses_the_watchs_norms_only_when_they_are_torchs_own_bit_for_bit():
    """Large gradients get a faster norm (norms.l2_norms exact=False) unless the run clips with them: the clipped
    run then trains exactly as clip_grad_norm_ does."""
    def make():
        torch.manual_seed(0)
        return nn.Sequential(nn.Linear(256, 512), nn.Tanh(), nn.Linear(512, 1))  # 131072 weights: >= norms.BIG

    g = torch.Generator().manual_seed(1)
    batches = [{"x": torch.randn(32, 256, generator=g), "y": torch.randn(32, 1, generator=g)} for _ in range(4)]

    def loss(m, b):
        return ((m(b["x"]) - b["y"]) ** 2).mean()

    t = Task(model=make(), batches=batches, loss=loss, name="t", max_grad_norm=0.05,
             optimizer=lambda p: torch.optim.SGD(p, lr=0.5))
    trainer = Trainer(t, RunSettings(TrainSettings(device="cpu", max_steps=4)), Log(stream=io.StringIO()))
    assert trainer.watch.exact_grad_norms
    assert trainer.run().status == "clean"
    plain = make()
    opt = torch.optim.SGD(plain.parameters(), lr=0.5)
    for b in batches:
        opt.zero_grad()
        loss(plain, b).backward()
        torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.05)
        opt.step()
    assert all(torch.equal(a, b) for a, b in zip(trainer.model.parameters(), plain.parameters()))
    unclipped = Trainer(Task(model=make(), batches=batches, loss=loss, name="t"),
                        RunSettings(TrainSettings(device="cpu")), Log(stream=io.StringIO()))
    assert not unclipped.watch.exact_grad_norms
