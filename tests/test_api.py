"""The Python API around a training loop the user owns."""

import pytest
import torch

import debug_nan
from tests import scenarios


def _loop(task, steps=4):
    optimizer = task.optimizer(list(task.model.parameters())) if getattr(task, "optimizer", None) else \
        torch.optim.AdamW(task.model.parameters(), lr=1e-3)
    monitor = debug_nan.Monitor(task.model, task.loss, optimizer)
    for _, batch in zip(range(steps), task.batches * 4):
        with monitor.step(batch) as step:
            loss = task.loss(task.model, batch)
            step.watch_loss(loss)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return monitor


def test_clean_loop_raises_nothing():
    monitor = _loop(scenarios.healthy_masks())
    assert monitor.steps == 4


def test_trip_raises_with_the_origin():
    with pytest.raises(debug_nan.NonFiniteError) as info:
        _loop(scenarios.masked_softmax())
    f = info.value.finding
    assert (f.step, f.phase, f.module, f.cause) == (1, "forward", "attn", "all_masked_softmax")
    assert "all_masked_softmax" in str(info.value)


def test_users_own_exception_is_a_trip():
    with pytest.raises(debug_nan.NonFiniteError) as info:
        _loop(scenarios.raises_on_nan())
    assert info.value.finding.step == 2 and info.value.finding.exception.startswith("ValueError")
    assert isinstance(info.value.__cause__, ValueError)


def test_optimizer_made_the_parameter_nan():
    with pytest.raises(debug_nan.NonFiniteError) as info:
        _loop(scenarios.adam_eps_zero())
    f = info.value.finding
    assert (f.step, f.phase, f.cause) == (1, "optimizer", "nonfinite_parameter")
    assert "unused_scale" in f.explanation


def test_unrelated_bug_is_re_raised_as_is():
    task = scenarios.healthy_masks()
    monitor = debug_nan.Monitor(task.model, task.loss)
    with pytest.raises(KeyError):
        with monitor.step(task.batches[0]):
            raise KeyError("not a numerical problem")
