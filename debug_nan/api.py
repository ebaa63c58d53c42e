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
    monitor.close()                                            # or: with debug_nan.Monitor(...) as monitor:

On leaving the block the monitor does its one host sync. If a module output, the loss or a gradient went
non-finite (or your code raised inside the block), it replays that micro-batch from a snapshot taken at the
start of the block under the op-level tracer and raises `debug_nan.NonFiniteError`, whose `.finding` holds the
origin (same fields as the JSON report's `first_nonfinite`). A parameter that the optimizer step made non-finite
is caught at the next `step()`, and the optimizer step is replayed to find the op. The monitor checks only inside
`step()`: a validation pass between steps is not watched.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from debug_nan.checks.driver import StepInputs, TaskFailure
from debug_nan.checks.finding import Finding
from debug_nan.checks.pinpoint import Pinpointer
from debug_nan.checks.snapshot import Snapshot, capture_rng
from debug_nan.checks.stats import capture_batch
from debug_nan.checks.watch import Watch
from debug_nan.report.summary import finding_lines
from debug_nan.train.task import split_loss


class NonFiniteError(RuntimeError):
    """Raised by Monitor.step() when the first NaN/Inf was found; `.finding` says where and why."""

    def __init__(self, finding: Finding):
        self.finding = finding
        super().__init__("first non-finite value found:\n" + "\n".join(finding_lines(finding)))


class Monitor:
    """Watch (always on inside step()) + pinpoint (on a trip) around a training loop you own. It is the
    pinpointer's StepDriver: the replay calls `loss_fn` and your optimizer through the methods below."""

    accumulation_steps = 1  # each step() block is one micro-batch and one optimizer step

    def __init__(self, model: torch.nn.Module, loss_fn, optimizer: torch.optim.Optimizer | None = None,
                 log=lambda line="", colour=None: None):
        self.model, self.loss_fn, self.optimizer, self.log = model, loss_fn, optimizer, log
        self.device = next(model.parameters()).device
        self.watch = Watch(model, optimizer)
        self.watch.enabled = False  # on only inside step()
        # two snapshots: a parameter trip is found at the next step(), and replays the step before it
        self.snapshots = [Snapshot(model, optimizer) for _ in range(2)]
        self.pinpointer = Pinpointer(self)
        self.steps = 0
        self.closed = False
        self._previous: StepInputs | None = None

    # -- the StepDriver methods --------------------------------------------------------------------------------
    def replay_loss(self, batch):
        return split_loss(self.loss_fn(self.model, batch))

    def backward(self, loss: torch.Tensor, scaled: bool = True) -> None:
        loss.backward()

    def optimizer_step(self) -> None:
        self.optimizer.step()

    def average_gradients(self) -> None:
        pass  # a single process

    def watch_paused(self):
        return self.watch.paused()

    # -- the user's side ---------------------------------------------------------------------------------------
    def watch_loss(self, loss) -> None:
        loss, parts = split_loss(loss)
        self.watch.watch_loss(loss, parts)

    @contextmanager
    def step(self, batch):
        """One micro-batch. Raises NonFiniteError when its forward, loss or backward went non-finite."""
        if self.closed:
            raise RuntimeError("this debug_nan.Monitor is closed: create a new one to watch more steps")
        self.steps += 1
        inputs = StepInputs(step=self.steps, batches=[capture_batch(batch, self.device)],
                            rng=[capture_rng(self.device)], snapshot=self.snapshots[self.steps % 2])
        inputs.snapshot.save()
        self.watch.discard()
        self.watch.enabled = True
        error = None
        try:
            if self.optimizer is not None and self._previous is not None:
                self.watch.watch_params()  # what the user's optimizer step after the previous block left
            self.watch.watch_batch(batch)
            try:
                yield self
            except (KeyboardInterrupt, NonFiniteError):
                raise
            except Exception as exc:  # the user's own NaN check raising is a trip too
                error = exc
            self.watch.watch_grads()
            bad = self.watch.sync().first_harm()
        finally:
            self.watch.enabled = False
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

    def close(self) -> None:
        """Remove the hooks from the model (it is left as it was); the monitor cannot be used again."""
        self.watch.close()
        self.closed = True

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
