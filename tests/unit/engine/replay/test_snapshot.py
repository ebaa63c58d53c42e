"""Snapshot round trip: save, change everything a training step changes, restore, and every piece is back."""

import random

import numpy as np
import pytest
import torch
from torch import nn

from debug_nan.engine.replay.snapshot import Snapshot, capture_rng, restore_rng


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.bn = nn.BatchNorm1d(3)
        self.head = nn.Linear(3, 1)

    def forward(self, x):
        return self.head(self.bn(self.lin(x))).squeeze(-1)


def train_one_step(model, optimizer, scheduler=None, scaler=None):
    x = torch.randn(8, 4)
    loss = model(x).pow(2).mean()
    if scaler is not None:
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    else:
        loss.backward()
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad()


def state_of(model, optimizer, scheduler=None, scaler=None) -> dict:
    """Everything by value, comparable with ==."""
    return {
        "params": [p.detach().clone() for p in model.parameters()],
        "buffers": [b.detach().clone() for b in model.buffers()],
        "opt": [[(k, v.clone() if isinstance(v, torch.Tensor) else v) for k, v in sorted(optimizer.state[p].items())]
                for p in model.parameters() if p in optimizer.state] if optimizer else None,
        "lr": [g["lr"] for g in optimizer.param_groups] if optimizer else None,
        "sched": scheduler.state_dict() if scheduler else None,
        "scale": scaler.get_scale() if scaler else None,
        "growth": int(scaler._growth_tracker) if scaler and scaler._growth_tracker is not None else None,
        "training": [m.training for m in model.modules()],
    }


def same(x, y) -> bool:
    if isinstance(x, torch.Tensor):
        return isinstance(y, torch.Tensor) and torch.equal(x, y)
    if isinstance(x, (list, tuple)):
        return isinstance(y, (list, tuple)) and len(x) == len(y) and all(same(a, b) for a, b in zip(x, y))
    if isinstance(x, dict):
        return isinstance(y, dict) and x.keys() == y.keys() and all(same(x[k], y[k]) for k in x)
    return x == y


def assert_same(a: dict, b: dict) -> None:
    for key in a:
        assert same(a[key], b[key]), key


def test_round_trip_parameters_buffers_optimizer_scheduler_flags():
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: 0.5 ** i)
    train_one_step(model, optimizer, scheduler)  # optimizer state exists (step, exp_avg, exp_avg_sq)
    model.bn.eval()  # a frozen submodule: its flag is part of the state
    snapshot = Snapshot(model, optimizer, None, scheduler)
    snapshot.save()
    before = state_of(model, optimizer, scheduler)
    model.train()
    for _ in range(3):
        train_one_step(model, optimizer, scheduler)
    after = state_of(model, optimizer, scheduler)
    assert not same(before["params"], after["params"]) and not same(before["opt"], after["opt"])
    assert not torch.equal(before["params"][0], after["params"][0])
    assert before["buffers"][0].ne(after["buffers"][0]).any()  # BatchNorm running mean moved
    assert before["sched"] != after["sched"] and before["lr"] != after["lr"]
    assert before["training"] != after["training"]
    snapshot.restore()
    assert_same(state_of(model, optimizer, scheduler), before)
    assert all(p.grad is None for p in model.parameters())


def test_restore_forgets_optimizer_state_born_after_the_save():
    model = Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    snapshot = Snapshot(model, optimizer)
    snapshot.save()  # no state yet: Adam creates it on its first step
    train_one_step(model, optimizer)
    assert len(optimizer.state) > 0
    snapshot.restore()
    assert len(optimizer.state) == 0


def test_round_trip_fp16_scaler_state():
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=1)
    train_one_step(model, optimizer, scaler=scaler)
    snapshot = Snapshot(model, optimizer, scaler)
    snapshot.save()
    before = state_of(model, optimizer, scaler=scaler)
    for _ in range(2):
        train_one_step(model, optimizer, scaler=scaler)
    assert scaler.get_scale() != before["scale"]
    snapshot.restore()
    assert_same(state_of(model, optimizer, scaler=scaler), before)


def test_without_an_optimizer():
    model = Net()
    snapshot = Snapshot(model)
    snapshot.save()
    before = state_of(model, None)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    snapshot.restore()
    assert_same(state_of(model, None), before)


def test_state_dicts_load_into_a_fresh_model():
    """A repro bundle's path: state_dicts() on one model, load_state_dicts() into a new one."""
    torch.manual_seed(1)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1, gamma=0.1)
    train_one_step(model, optimizer, scheduler)
    model.bn.eval()
    snapshot = Snapshot(model, optimizer, None, scheduler)
    snapshot.save()
    expected = state_of(model, optimizer, scheduler)
    states = snapshot.state_dicts()
    assert states["training"]["bn"] is False and states["training"][""] is True

    torch.manual_seed(2)
    fresh = Net()
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-2)
    fresh_scheduler = torch.optim.lr_scheduler.StepLR(fresh_optimizer, 1, gamma=0.1)
    fresh_snapshot = Snapshot(fresh, fresh_optimizer, None, fresh_scheduler)
    fresh_snapshot.load_state_dicts(states)
    assert_same(state_of(fresh, fresh_optimizer, fresh_scheduler), expected)
    train_one_step(fresh, fresh_optimizer, fresh_scheduler)
    fresh_snapshot.restore()  # load_state_dicts() also saved it as the snapshot
    assert_same(state_of(fresh, fresh_optimizer, fresh_scheduler), expected)


@pytest.mark.parametrize("draws", [1, 5])
def test_rng_round_trip(draws):
    state = capture_rng(torch.device("cpu"))
    first = (torch.rand(3), np.random.rand(2), [random.random() for _ in range(draws)])
    restore_rng(state, torch.device("cpu"))
    again = (torch.rand(3), np.random.rand(2), [random.random() for _ in range(draws)])
    assert torch.equal(first[0], again[0]) and np.array_equal(first[1], again[1]) and first[2] == again[2]


def test_stage_keeps_what_the_forward_changes_for_a_save_later_in_the_step():
    """The Trainer stages at the start of a step and saves after the first sync: the saved buffers and training
    flags must be those the forward found, the parameters those of the save (unchanged in between)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.BatchNorm1d(3))
    snap = Snapshot(model, torch.optim.SGD(model.parameters(), lr=0.1))
    model(torch.randn(8, 3) + 2)  # running statistics that are not their initial zeros
    snap.stage()
    running_mean = model[1].running_mean.clone()
    model(torch.randn(8, 3) + 5)  # the forward moves the running statistics
    model.eval()
    snap.save()
    weight = model[0].weight.detach().clone()
    model.train()
    model(torch.randn(8, 3) - 5)
    with torch.no_grad():
        model[0].weight.add_(1.0)
    model.eval()
    snap.restore()
    assert torch.equal(model[1].running_mean, running_mean) and not torch.equal(running_mean, torch.zeros(3))
    assert torch.equal(model[0].weight, weight)
    assert model.training and model[1].training  # as staged, before the eval() that came before save()
    snap.save()  # a save without a stage copies the live buffers, as before
    model(torch.randn(8, 3))
    snap.restore()
    assert torch.equal(model[1].running_mean, running_mean)
