"""A Python API for people who keep their own training loop.

    import debug_nan

    monitor = debug_nan.Monitor(model, loss_fn, optimizer)     # loss_fn(model, batch) -> scalar (or {"loss": ...})
    for batch in loader:
        with monitor.step(batch) as step:                      # one micro-batch: your forward + backward inside
            loss = loss_fn(model, batch)
            step.watch_loss(loss)                              # optional: the loss is checked too
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()

On leaving the block the monitor does its one host sync. If a module output, the loss or a gradient went
non-finite (or your code raised inside the block), it replays that micro-batch from a snapshot taken at the
start of the block under the op-level tracer and raises `debug_nan.NonFiniteError`, whose `.finding` holds the
origin (same fields as the JSON report's `first_nonfinite`). A parameter that the optimizer step made non-finite
is caught at the next `step()`, and the optimizer step is replayed to find the op.
"""

from __future__ import annotations

from contextlib import contextmanager
from types import SimpleNamespace

import torch

from debug_nan.checks.pinpoint import Pinpointer, StepInputs, TaskFailure
from debug_nan.checks.snapshot import Snapshot, capture_rng
from debug_nan.checks.watch import Watch
from debug_nan.report.finding import Finding
from debug_nan.report.summary import finding_lines
from debug_nan.train.loop import split_loss


class NonFiniteError(RuntimeError):
    """Raised by Monitor.step() when the first NaN/Inf was found; `.finding` says where and why."""

    def __init__(self, finding: Finding):
        self.finding = finding
        super().__init__("first non-finite value found:\n" + "\n".join(finding_lines(finding)))


class Monitor:
    """Watch (always on) + pinpoint (on a trip) around a training loop you own."""

    def __init__(self, model: torch.nn.Module, loss_fn, optimizer: torch.optim.Optimizer | None = None,
                 log=lambda line="", colour=None: None, explosion_threshold: float = 1e4,
                 explosion_growth: float = 1e3):
        self.model, self.loss_fn, self.optimizer, self.log = model, loss_fn, optimizer, log
        self.device = next(model.parameters()).device
        self.watch = Watch(model, optimizer)
        self.scaler = None
        self.accum = 1
        self.s = SimpleNamespace(explosion_threshold=explosion_threshold, explosion_growth=explosion_growth,
                                 max_grad_norm=None)
        self.snapshots = [Snapshot(model, optimizer, None, None) for _ in range(2)] if optimizer else []
        self.pinpointer = Pinpointer(self)
        self.steps = 0
        self._previous: StepInputs | None = None

    # the hooks the pinpointer replays through (the same names the CLI's Trainer has)
    def compute_loss(self, batch, replay: bool = False):
        return split_loss(self.loss_fn(self.model, batch))

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def clip_and_step(self, grad_norms) -> None:
        self.optimizer.step()

    def watch_loss(self, loss) -> None:
        loss, parts = split_loss(loss)
        self.watch.watch_loss(loss, parts)

    @contextmanager
    def step(self, batch):
        """One micro-batch. Raises NonFiniteError when its forward, loss or backward went non-finite."""
        self.steps += 1
        if self.optimizer is not None and self._previous is not None:
            self.watch.watch_params()  # what the user's optimizer step after the previous block left
        inputs = StepInputs(step=self.steps, batches=[batch], rng=[capture_rng(self.device)])
        if self.snapshots:
            inputs.snapshot = self.snapshots[self.steps % 2]
            inputs.snapshot.save()
        else:  # no optimizer: parameters are still restored for the replay
            inputs.snapshot = _ParamSnapshot(self.model)
        self.watch.watch_batch(batch)
        error = None
        try:
            yield self
        except (KeyboardInterrupt, NonFiniteError):
            raise
        except Exception as exc:  # the user's own NaN check raising is a trip too
            error = exc
        self.watch.watch_grads()
        result = self.watch.sync()
        bad = result.first_harm()
        if bad is None and error is None:
            self._previous = inputs
            return
        try:
            if bad is not None and bad.kind == "param" and self._previous is not None:
                finding = self.pinpointer.pinpoint(self._previous, 1, bad, None, optimizer=True)
            else:
                finding = self.pinpointer.pinpoint(inputs, 1, bad, error)
        except TaskFailure:
            raise error from None
        raise NonFiniteError(finding) from error


class _ParamSnapshot:
    """Parameters only, for a Monitor without an optimizer."""

    def __init__(self, model: torch.nn.Module):
        self.model = model
        self.params = [p.detach().clone() for p in model.parameters()]

    def restore(self) -> None:
        with torch.no_grad():
            for p, saved in zip(self.model.parameters(), self.params):
                p.copy_(saved)
                p.grad = None
