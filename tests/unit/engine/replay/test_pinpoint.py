"""The pinpointer through its StepDriver seam: a hand-written driver replays, and an out-of-memory replay keeps the
watch's finding (through the CLI too: tests/e2e/cli/test_pinpoint.py)."""

from contextlib import contextmanager
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from debug_nan.engine.replay.driver import StepDriver, StepInputs
from debug_nan.engine.replay.pinpoint import Pinpointer
from debug_nan.engine.replay.snapshot import Snapshot, capture_rng
from debug_nan.engine.replay.trip import Trip
from debug_nan.engine.watch.watch import Check


class PlainDriver:
    """The smallest StepDriver: one process, fp32, no watch."""

    accumulation_steps = 1
    first_step, checkpoint, dist = 0, None, None

    def __init__(self, model, loss_fn, optimizer=None):
        self.model, self.loss_fn, self.optimizer = model, loss_fn, optimizer
        self.device = torch.device("cpu")
        self.lines = []

    def log(self, line="", colour=None):
        self.lines.append(line)

    def replay_loss(self, batch, tape=None):
        return self.loss_fn(self.model, batch), {}

    def backward(self, loss, scaled=True):
        loss.backward()

    def optimizer_step(self, tape=None):
        self.optimizer.step()

    def average_gradients(self):
        pass

    @contextmanager
    def watch_paused(self):
        yield


def inputs_for(model, batch, optimizer=None) -> StepInputs:
    snapshot = Snapshot(model, optimizer)
    snapshot.save()
    return StepInputs(step=1, batches=[batch], rng=[capture_rng(torch.device("cpu"))], snapshot=snapshot)


def test_a_hand_written_driver_is_a_step_driver_and_replays():
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    driver = PlainDriver(model, lambda m, b: torch.log(m(b["x"]) * 0).mean())  # log(0) = -inf in the loss
    assert isinstance(driver, StepDriver)
    batch = {"x": torch.randn(4, 3)}
    f = Pinpointer(driver).pinpoint(Trip(inputs_for(model, batch), 1, Check("loss", "", float("-inf"))))
    assert (f.phase, f.op, f.kind, f.cause) == ("loss", "aten.log.default", "inf", "log_of_nonpositive")
    line = next(i for i, text in enumerate(Path(__file__).read_text().splitlines(), 1) if "torch.log(m(b" in text)
    assert f.source.endswith(f"test_pinpoint.py:{line}")
    assert any("TRIP at step 1, micro-batch 1" in line for line in driver.lines)


def test_the_replay_restores_the_snapshot_first():
    """Parameters changed after the snapshot (by the failing step's own update) are put back before the replay."""
    model = nn.Linear(3, 1)
    with torch.no_grad():
        model.weight.fill_(1.0)
    driver = PlainDriver(model, lambda m, b: torch.sqrt(m(b["x"])).sum())
    inputs = inputs_for(model, {"x": -torch.ones(2, 3)})
    with torch.no_grad():
        model.weight.fill_(-1.0)  # would make sqrt's input positive: no NaN
    f = Pinpointer(driver).pinpoint(Trip(inputs, 1, Check("loss", "", float("nan"))))
    assert (f.op, f.cause) == ("aten.sqrt.default", "invalid_domain")


def test_out_of_memory_in_the_replay_keeps_the_watch_finding():
    model = nn.Linear(3, 1)

    def loss(m, b):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB.")

    driver = PlainDriver(model, loss)
    f = Pinpointer(driver).pinpoint(Trip(inputs_for(model, {"x": torch.ones(2, 3)}), 1,
                                         Check("loss", "", float("nan"))))
    assert (f.phase, f.kind, f.cause, f.detected_by) == ("loss", "nan", "unknown", "watch")
    assert "the op-level replay ran out of memory (OutOfMemoryError: CUDA out of memory" in f.explanation
    assert any("ran out of memory" in line for line in driver.lines)


def test_the_replay_sees_the_batch_as_produced_each_time():
    """A loss that changes its batch in place: every replay (the fp16 probe, then the traced one) starts from
    the batch as captured."""
    model = nn.Linear(3, 1)
    seen = []

    def loss(m, b):
        seen.append(b["x"].clone())
        b["x"].mul_(10.0)
        return F.mse_loss(m(b["x"]).squeeze(-1), torch.zeros(2))

    driver = PlainDriver(model, loss)
    inputs = inputs_for(model, {"x": torch.ones(2, 3)})
    pinpointer = Pinpointer(driver)
    assert pinpointer.finite_without_scaling(inputs, 1)
    pinpointer.replay(inputs, 1)
    assert len(seen) == 2 and all(torch.equal(x, torch.ones(2, 3)) for x in seen)
    assert torch.equal(inputs.batches[0]["x"], torch.ones(2, 3))


def test_a_replay_that_computes_otherwise_than_the_run_says_so():
    """The replay starts from the run's own state, so where its value at the watch's check differs from the run's
    (the run's compiled or non-deterministic kernels), the finding says how; where it agrees it says nothing."""
    torch.manual_seed(0)
    model = nn.Linear(3, 1)
    nan_loss = PlainDriver(model, lambda m, b: (m(b["x"]) * 0 / 0).mean())
    batch = {"x": torch.randn(4, 3)}
    f = Pinpointer(nan_loss).pinpoint(Trip(inputs_for(model, batch), 1, Check("loss", "", float("inf"), "+inf")))
    assert "The watch saw the run's loss +inf; this replay from the same state computed nan" in f.explanation
    f = Pinpointer(nan_loss).pinpoint(Trip(inputs_for(model, batch), 1, Check("loss", "", float("nan"), "nan")))
    assert "The watch saw" not in f.explanation
    # the bias's gradient is sqrt's at 0 (infinite); the weight's stays finite
    bias_only = PlainDriver(model, lambda m, b: m(b["x"]).sum() + torch.sqrt(m.bias - m.bias.detach()).sum())
    f = Pinpointer(bias_only).pinpoint(Trip(inputs_for(model, batch), 1, Check("grad", "weight", float("nan"), "nan")))
    assert ("The watch saw the run's gradient of `weight` go nan; in this replay from the same state it stayed "
            "finite, and 1 other parameter(s)' did not (`bias` first)") in f.explanation
    f = Pinpointer(bias_only).pinpoint(Trip(inputs_for(model, batch), 1, Check("grad", "bias", float("inf"), "inf")))
    assert "The watch saw" not in f.explanation
