"""One host sync per micro-batch: device-to-host transfers counted while the watch does its work.

Counted: `aten._local_scalar_dense` (item(), bool(), float(), int() of a tensor), and every call of
Tensor.cpu(), .numpy() and .tolist(). The models here make no host sync of their own, so every count is the
watch's (or the loop's).
"""

import io
import itertools

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

import debug_nan
from debug_nan.drivers.task import Task
from debug_nan.drivers.trainer.loop import Trainer
from debug_nan.engine.watch.watch import Watch
from debug_nan.presentation.log import Log
from debug_nan.app.job_settings import build_settings


class HostSyncs(TorchDispatchMode):
    """Counts device-to-host reads while active."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self.what: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self._hit(str(func))
        return func(*args, **(kwargs or {}))

    def _hit(self, what: str) -> None:
        self.count += 1
        self.what.append(what)

    def __enter__(self):
        self._saved = {name: getattr(torch.Tensor, name) for name in ("cpu", "numpy", "tolist")}
        for name, method in self._saved.items():
            def counted(t, *a, _name=name, _method=method, **k):
                self._hit(f"Tensor.{_name}")
                return _method(t, *a, **k)

            setattr(torch.Tensor, name, counted)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, method in self._saved.items():
            setattr(torch.Tensor, name, method)
        return super().__exit__(*exc)


def model_without_syncs() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.LayerNorm(16), nn.GELU(), nn.Dropout(0.1), nn.Linear(16, 1))


def batches(n: int) -> list[dict]:
    g = torch.Generator().manual_seed(1)
    return [{"x": torch.randn(5, 6, generator=g), "y": torch.randn(5, 1, generator=g)} for _ in range(n)]


def mse(model, batch):
    return ((model(batch["x"]) - batch["y"]) ** 2).mean()


def test_counter_sees_item_bool_and_transfers():
    t = torch.ones(3)
    with HostSyncs() as syncs:
        t.sum().item()
        bool(t.any())
        t.tolist()
        t.cpu().numpy()
    assert syncs.count == 5


def test_watch_makes_one_sync_per_micro_batch():
    model = model_without_syncs()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    watch = Watch(model, optimizer)
    for step in range(3):
        optimizer.zero_grad(set_to_none=True)
        for batch in batches(3):  # 3 micro-batches per step
            with HostSyncs() as syncs:
                watch.watch_batch(batch)
                loss = mse(model, batch)
                watch.watch_loss(loss, {"half": loss / 2})
                (loss / 3).backward()
                watch.watch_grads()
                result = watch.sync()
            assert syncs.count == 1, syncs.what
            # (GELU, Dropout: torch.nn weightless, not hooked)
            assert result.first_harm() is None and len(result.values("forward")) == 4
        optimizer.step()  # AdamW on the CPU reads its step counter (.item()): not the watch's, not counted
        with HostSyncs() as syncs:
            watch.watch_params()  # on the device; read at the next micro-batch's sync
        assert syncs.count == 0


def test_monitor_step_makes_one_sync():
    model = model_without_syncs()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    monitor = debug_nan.Monitor(model, mse, optimizer)
    for batch in batches(4):
        with HostSyncs() as syncs:
            with monitor.step(batch) as step:
                loss = mse(model, batch)
                step.watch_loss(loss)
                loss.backward()
        assert syncs.count == 1, syncs.what
        optimizer.step()
        optimizer.zero_grad()


@pytest.mark.parametrize("accumulation", [1, 3])
def test_training_step_makes_one_sync_per_micro_batch(accumulation):
    """The runner's whole step (snapshot, micro-batches, clipping, SGD step, schedule, history, log lines)."""
    model = model_without_syncs()
    task = Task(model=model, batches=batches(3), loss=mse, optimizer=lambda p: torch.optim.SGD(p, lr=1e-2))
    settings = build_settings(None, {"device": "cpu", "gradient_accumulation_steps": accumulation})
    trainer = Trainer(task, settings, Log(stream=io.StringIO()))
    stream = itertools.cycle(task.batches)
    for step in range(1, 4):
        with HostSyncs() as syncs:
            finding = trainer.train_step(step, stream)
        assert finding is None and syncs.count == accumulation, syncs.what
    assert trainer.history.steps[-1].grad_norm > 0 and len(trainer.history.steps[-1].activations) == 4
