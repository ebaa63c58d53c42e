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

On leaving the block the monitor does its one host sync. If the loss or a gradient went non-finite (or your code
raised inside the block), it replays that micro-batch from a snapshot taken at the start of the optimizer step
under the op-level tracer and raises `debug_nan.NonFiniteError`, whose `.finding` holds the origin (same fields as
the JSON report's `first_nonfinite`). A parameter that the optimizer step made non-finite is caught at the next
`step()` (the optimizer's step hook tells the monitor when you stepped), and the optimizer step is replayed to find
the op. After a step's last micro-batch the gradient norms are checked for an explosion, as in the CLI.

The protocol is the CLI's step session (engine/session/session.py): the same checks and decisions. Tell the monitor what
your loop does, so that its replay does it too:
    accumulation_steps=N   you back-propagate loss / N for N micro-batches (one step() block each), then step
    scaler=GradScaler      you back-propagate scaler.scale(loss) and step through scaler.step(optimizer)
    max_grad_norm=X        you clip the total gradient norm to X before the optimizer step
Outside `step()`, every forward of the model made with gradients off (a validation pass, generation) is checked
too: a NaN/+Inf in its output raises NonFiniteError there, the forward's op named (phase "eval"; a -Inf-only output
is a mask and stays silent).
"""

from __future__ import annotations

from contextlib import contextmanager

import torch

from debug_nan import torch_support

torch_support.require()  # the Monitor and the framework callbacks (which import this): one line, before the
# imports below

from debug_nan.drivers.eval_forwards import ForwardsOutsideTraining  # noqa: E402
from debug_nan.drivers.session_driver import SessionDriver  # noqa: E402
from debug_nan.drivers.task import split_loss  # noqa: E402
from debug_nan.engine.explain.finding import Finding  # noqa: E402
from debug_nan.engine.replay.driver import TaskFailure  # noqa: E402
from debug_nan.engine.session.precision import autocast_as, autocast_state  # noqa: E402
from debug_nan.engine.watch.module_hooks import ModuleHook, keep_out_of_copies  # noqa: E402
from debug_nan.presentation.summary import finding_lines  # noqa: E402
from debug_nan.settings.watch import WatchSettings  # noqa: E402


class NonFiniteError(RuntimeError):
    """Raised by Monitor.step() when the first NaN/Inf was found; `.finding` says where and why."""

    def __init__(self, finding: Finding):
        self.finding = finding
        super().__init__("first non-finite value found:\n" + "\n".join(finding_lines(finding)))


class Monitor(SessionDriver):
    """Watch (always on inside step()) + pinpoint (on a trip) around a training loop you own: a driver of the
    step session, and the pinpointer's StepDriver (the replay calls `loss_fn` and your optimizer through the
    methods below). The loop's state is its own (first_step 0, no checkpoint); one process."""

    def __init__(self, model: torch.nn.Module, loss_fn, optimizer: torch.optim.Optimizer | None = None,
                 log=lambda line="", colour=None: None, *, accumulation_steps: int = 1, scaler=None,
                 max_grad_norm: float | None = None, explosion_threshold: float = 1e4,
                 explosion_growth: float = 1e3, detailed: bool = False, snapshot: str = "host",
                 snapshot_every: int | None = None, outputs_every: int | None = None):
        if accumulation_steps < 1:
            raise ValueError(f"accumulation_steps={accumulation_steps}: give the number of micro-batches (step() "
                             f"blocks) per optimizer step, 1 or more")
        self.model, self.loss_fn, self.optimizer, self.log = model, loss_fn, optimizer, log
        self.device = next(model.parameters()).device
        self.accumulation_steps, self.max_grad_norm = accumulation_steps, max_grad_norm
        knobs = WatchSettings(explosion_threshold=explosion_threshold, explosion_growth=explosion_growth,
                              snapshot=snapshot, snapshot_every=snapshot_every or 0, outputs_every=outputs_every or 0)
        self.open_session(knobs, scaler=scaler)
        self.watch.enabled = False  # on only inside step()
        self.watch.detailed = detailed
        self.closed = False
        self._replaying = False
        self._micro = 0  # micro-batches of the optimizer step under way
        # the optimizer tells when the user's loop stepped (a GradScaler's skipped step never reaches it)
        self._hook = optimizer.register_step_post_hook(self._stepped) if optimizer is not None else None
        self._outside = self._watch_outside()
        self._autocast: tuple | None = None  # the autocast state of the model's last forward inside step()
        self._forward_hook = self._hook_forward()

    def _hook_forward(self):
        """The model's forward pre-hook that reads the autocast state it runs under (a copy of the model holds none
        of it: module_hooks.keep_out_of_copies)."""
        keep_out_of_copies(self.model)
        return self.model.register_forward_pre_hook(ModuleHook(self._forward_state, compiled="eager"))

    def _forward_state(self, *_) -> None:
        if self.watch.enabled and not self._replaying:
            self._autocast = autocast_state()

    @property
    def steps(self) -> int:
        """Optimizer steps begun so far (with accumulation_steps=1: step() blocks entered)."""
        return self.session.steps

    # -- the StepDriver methods --------------------------------------------------------------------------------
    def replay_loss(self, batch, tape=None):
        """loss_fn again, under the autocast state the model's forward ran under in the run (your autocast region
        is inside the step() block, which the replay does not run)."""
        with autocast_as(self._autocast):
            return split_loss(self.loss_fn(self.model, batch))

    def share_of_step(self, loss: torch.Tensor) -> torch.Tensor:
        """Your loop back-propagates loss / accumulation_steps (the loss itself without accumulation)."""
        return loss / self.accumulation_steps if self.accumulation_steps > 1 else loss

    def clip_gradients(self) -> None:
        """Your loop's clipping as the monitor was told it (max_grad_norm), after the scaler's unscale."""
        if self.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.max_grad_norm)

    @contextmanager
    def watch_paused(self):
        self._replaying = True  # the replay's own optimizer step is not the user's
        try:
            with self.watch.paused():
                yield
        finally:
            self._replaying = False

    # -- the user's side ---------------------------------------------------------------------------------------
    def watch_loss(self, loss) -> None:
        self.session.watch_loss(*split_loss(loss))

    def _stepped(self, *_) -> None:
        if not self._replaying and not self.closed:
            self.session.stepped()

    @contextmanager
    def step(self, batch):
        """One micro-batch. Raises NonFiniteError when its forward, loss or backward went non-finite (or, after
        the step's last micro-batch, when the gradient norm exploded)."""
        if self.closed:
            raise RuntimeError("this debug_nan.Monitor is closed: create a new one to watch more steps")
        session = self.session
        if self._micro == 0:
            session.begin_step()
        self._micro += 1
        last = self._micro == self.accumulation_steps
        if last:
            self._micro = 0
        session.begin_micro(batch)
        error = None
        try:
            yield self
        except (KeyboardInterrupt, NonFiniteError):
            self.watch.enabled = False
            self.watch.discard()
            raise
        except Exception as exc:  # noqa: BLE001 - the user's own NaN check raising is a trip too
            error = exc
        try:
            finding = session.end(last, error)
        except TaskFailure:
            raise error from None
        if finding is not None:
            raise NonFiniteError(finding) from error
        if error is not None:
            raise error

    def _watch_outside(self):
        """The model's forwards with gradients off outside step() (a validation pass, generation): a NaN/+Inf
        output raises NonFiniteError there, with the op the replay of that forward names."""
        return ForwardsOutsideTraining(self, [self.model], lambda: self.session.steps, self._found_outside)

    def _found_outside(self, finding: Finding) -> None:
        self.watch.enabled = False
        self.watch.discard()
        raise NonFiniteError(finding)

    def close(self) -> None:
        """Remove the hooks from the model and the optimizer (they are left as they were); the monitor cannot be
        used again until attach()."""
        self._outside.remove()
        self._forward_hook.remove()
        self.watch.close()
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self.closed = True

    def attach(self) -> None:
        """Register the hooks again after close() (the state the monitor holds is kept)."""
        self.watch.attach()
        self._forward_hook = self._hook_forward()
        if not self._outside.handles:
            self._outside = self._watch_outside()
        if self._hook is None and self.optimizer is not None:
            self._hook = self.optimizer.register_step_post_hook(self._stepped)
        self.closed = False

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
