"""The Python API around a training loop the user owns."""

import pytest
import torch

import debug_nan
from tests.support import scenarios


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


def test_a_validation_forward_between_steps_is_watched():
    """Outside step(), a forward with gradients off whose output holds NaN raises NonFiniteError there: phase eval,
    at the step before it, the masked softmax named; healthy ones between steps stay silent."""
    task = scenarios.healthy_masks()
    poisoned = scenarios.masked_softmax().batches[0]  # sample 2 has every key masked: NaN output
    optimizer = torch.optim.AdamW(task.model.parameters(), lr=1e-3)
    monitor = debug_nan.Monitor(task.model, task.loss, optimizer)
    for batch in task.batches[:2]:
        with monitor.step(batch) as step:
            loss = task.loss(task.model, batch)
            step.watch_loss(loss)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        with torch.no_grad():
            task.model(batch["x"], batch["valid"])
    with torch.no_grad(), pytest.raises(debug_nan.NonFiniteError) as raised:
        task.model(poisoned["x"], poisoned["valid"])
    f = raised.value.finding
    assert (f.phase, f.step, f.micro_step, f.op, f.cause) == \
        ("eval", 2, 2, "aten._softmax.default", "all_masked_softmax")
    assert monitor.steps == 2


def test_close_removes_the_hooks_and_ends_the_monitor():
    task = scenarios.healthy_masks()
    hooked = lambda: sum(len(m._forward_hooks) for m in task.model.modules())  # noqa: E731
    before = hooked()
    with debug_nan.Monitor(task.model, task.loss) as monitor:
        assert hooked() > before
    assert hooked() == before and monitor.closed
    with pytest.raises(RuntimeError, match="closed"):
        with monitor.step(task.batches[0]):
            pass


def test_the_monitor_is_a_step_driver():
    from debug_nan.engine.replay.driver import StepDriver

    task = scenarios.healthy_masks()
    assert isinstance(debug_nan.Monitor(task.model, task.loss), StepDriver)


def test_monitor_knows_the_users_grad_scaler():
    """Gradients ~1e34 are finite, but times the initial loss scale 65536 they pass float32's 3.4e38: the user's
    GradScaler skips that step and lowers the scale. With scaler= the monitor probes the micro-batch without the
    scale and takes it as the scaler's overflow (no finding), as the CLI does with --precision fp16."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-40)
    scaler = torch.amp.GradScaler("cpu")
    loss_fn = lambda m, b: (m(b) * 1e33).sum()  # noqa: E731
    batch = torch.full((2, 4), 10.0)
    before = model.weight.detach().clone()
    with debug_nan.Monitor(model, loss_fn, optimizer, scaler=scaler) as monitor:
        with monitor.step(batch):
            scaler.scale(loss_fn(model, batch)).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    record = monitor.session.history.steps[0]
    assert record.scaler_skipped and scaler.get_scale() == 32768.0
    assert torch.equal(model.weight, before)  # the user's scaler skipped the update: the monitor changed nothing
    # the history shows gradients unscaled: the bias's is 2 samples x 1e33, not 65536x that
    assert record.grad_norms["bias"] == pytest.approx(2e33, rel=1e-5)


def test_monitor_accumulates_and_checks_the_explosion():
    """accumulation_steps=2: two step() blocks make one optimizer step; the history has one record per step."""
    task = scenarios.healthy_masks()
    optimizer = torch.optim.AdamW(task.model.parameters(), lr=1e-3)
    with debug_nan.Monitor(task.model, task.loss, optimizer, accumulation_steps=2) as monitor:
        for batch in task.batches[:4]:
            with monitor.step(batch) as step:
                loss = task.loss(task.model, batch)
                step.watch_loss(loss)
                (loss / 2).backward()
            if monitor.session.micro == 2:
                optimizer.step()
                optimizer.zero_grad()
    records = monitor.session.history.steps
    assert [r.step for r in records] == [1, 2] and [r.micro_batches for r in records] == [2, 2]
    assert all(r.grad_norm > 0 for r in records)
