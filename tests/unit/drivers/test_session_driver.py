"""The one driver base (drivers/session_driver.py): the step session built once, "loss, scale, backward" and
"unscale, clip, step" as a GradScaler loop takes them, and every entry point on it, taking the replay's tape."""

import inspect
import io

import torch
from torch import nn

import debug_nan
from debug_nan.drivers.framework import FrameworkDriver
from debug_nan.drivers.run.driver import RunDriver
from debug_nan.drivers.run.replayer import ScriptReplayDriver
from debug_nan.drivers.session_driver import SessionDriver
from debug_nan.drivers.task import Task
from debug_nan.drivers.trainer.loop import Trainer
from debug_nan.engine.replay.driver import StepDriver
from debug_nan.presentation.log import Log
from debug_nan.settings import RunSettings
from debug_nan.settings.training import TrainSettings
from debug_nan.settings.watch import WatchSettings


class Clipped(SessionDriver):
    """A driver of a loop that accumulates 2 micro-batches and clips the total norm at 0.5."""

    accumulation_steps = 2

    def __init__(self, model, optimizer, scaler):
        self.model, self.optimizer, self.device, self.log = model, optimizer, torch.device("cpu"), lambda *a: None
        self.open_session(WatchSettings(), scaler=scaler)

    def replay_loss(self, batch, tape=None):
        return self.model(batch).pow(2).mean(), {}

    def clip_gradients(self) -> None:
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 0.5)


def _model():
    torch.manual_seed(0)
    return nn.Linear(4, 1)


BATCHES = [torch.randn(3, 4, generator=torch.Generator().manual_seed(i)) * 4 for i in range(2)]


def test_the_backward_is_the_losss_share_of_the_step_times_the_scale_and_scale_1_for_the_probe():
    model = _model()
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    driver = Clipped(model, torch.optim.SGD(model.parameters(), lr=0.1), scaler)
    assert driver.scaler is scaler and driver.session.scaler is scaler and isinstance(driver, StepDriver)
    loss, _ = driver.replay_loss(BATCHES[0])
    driver.backward(loss)
    scaled = model.weight.grad.clone()
    model.zero_grad()
    loss, _ = driver.replay_loss(BATCHES[0])
    driver.backward(loss, scaled=False)
    plain = _model()
    (plain(BATCHES[0]).pow(2).mean() / 2).backward()
    assert torch.equal(model.weight.grad, plain.weight.grad)
    assert torch.allclose(scaled, plain.weight.grad * 1024.0)


def test_the_update_is_a_gradscaler_loops_unscale_clip_step_bit_for_bit():
    model, plain = _model(), _model()
    driver = Clipped(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.amp.GradScaler("cpu"))
    optimizer, scaler = torch.optim.SGD(plain.parameters(), lr=0.1), torch.amp.GradScaler("cpu")
    for batch in BATCHES:
        loss, _ = driver.replay_loss(batch)
        driver.backward(loss)
        scaler.scale(plain(batch).pow(2).mean() / 2).backward()
    driver.optimizer_step(tape=None)
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(plain.parameters(), 0.5)
    scaler.step(optimizer)
    scaler.update()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), plain.parameters()))
    assert driver.scaler.get_scale() == scaler.get_scale()


def test_a_disabled_scaler_is_no_scaler_and_the_monitor_divides_only_under_accumulation():
    model = _model()
    driver = Clipped(model, torch.optim.SGD(model.parameters(), lr=0.1), torch.amp.GradScaler("cpu", enabled=False))
    assert driver.scaler is None and driver.session.scaler is None
    monitor = debug_nan.Monitor(model, lambda m, b: m(b).sum(), torch.optim.SGD(model.parameters(), lr=0.1))
    loss = torch.ones(())
    assert monitor.share_of_step(loss) is loss and driver.share_of_step(loss).item() == 0.5
    monitor.close()


def test_every_entry_point_is_a_session_driver_and_takes_the_replays_tape():
    model = _model()
    trainer = Trainer(Task(model=model, batches=[torch.ones(2, 4)], loss=lambda m, b: m(b).sum(), name="t"),
                      RunSettings(train=TrainSettings(device="cpu")), Log(stream=io.StringIO()))
    monitor = debug_nan.Monitor(model, lambda m, b: m(b).sum(), torch.optim.SGD(model.parameters(), lr=0.1))
    for driver in (trainer, monitor):
        assert isinstance(driver, SessionDriver) and isinstance(driver, StepDriver)
        assert driver.session.driver is driver and driver.watch is driver.session.watch
    monitor.close()
    assert issubclass(FrameworkDriver, SessionDriver) and issubclass(RunDriver, FrameworkDriver)
    for cls in (Trainer, debug_nan.Monitor, RunDriver, ScriptReplayDriver):
        for method in (cls.replay_loss, cls.optimizer_step):
            tape = inspect.signature(method).parameters.get("tape")
            assert tape is not None and tape.default is None, (cls, method)
