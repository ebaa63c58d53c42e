"""The one driver base: what every entry point is (the CLI's Trainer, the Monitor, the Lightning and HF callbacks'
drivers and `debug-nan run`'s, through drivers/framework.py's FrameworkDriver).

A SessionDriver owns the step session (engine/session/session.py), built once by `open_session` from the entry
point's settings and what only it knows (its loss scaler, its ranks' agreement, its bundle sink, its scheduler), and
is the session's StepDriver (engine/replay/driver.py) for the replay:

    replay_loss(batch, tape)   the entry point's own loss code for one micro-batch (each subclass's)
    backward(loss, scaled)     the loss's share of the step (share_of_step: the accumulation), times the fp16 loss
                               scale when `scaled`, back-propagated as the run does (run_backward)
    optimizer_step(tape)       unscale (fp16), clip_gradients, the optimizer step through the scaler
    average_gradients()        under DDP, the ranks' average; watch_paused(): the replay records nothing

`tape` is taken by every driver alike (`debug-nan run` replays it; the others call their own code and ignore it).
A subclass overrides the seams where its framework differs (share_of_step, run_backward, clip_gradients), never
the protocol: the watch, the snapshot, the fp16 probe, the DDP agreement, the replay and the bundle are the
session's.
"""

from __future__ import annotations

import torch

from debug_nan.engine.session.distributed import average_gradients
from debug_nan.engine.session.policies import SessionPolicies
from debug_nan.engine.session.precision import scaled_step
from debug_nan.engine.session.session import StepSession
from debug_nan.settings.watch import WatchSettings


class SessionDriver:
    dialect = "api"  # the advice's words (engine/vocabulary.py): a library's user sets arguments, not CLI flags
    session_class = StepSession  # `debug-nan run` swaps in its own (its history)
    first_step, checkpoint, dist = 0, None, None  # (StepDriver) a fresh start in one process, unless told
    accumulation_steps = 1
    scaler = None  # an enabled GradScaler, or None
    # set by the subclass before open_session: the StepSession reads them as it is built
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer | None
    device: torch.device

    def open_session(self, settings: WatchSettings, *, scaler=None, watch=None, **policies) -> StepSession:
        """Build this entry point's step session, once: `settings` are its knobs, the watch's (all the engine sees:
        explosion thresholds, snapshot, output schedule), `scaler` its GradScaler (kept only when enabled),
        `policies` the rest of SessionPolicies.from_settings' arguments (agreement, bundle_sink, scheduler, ...).
        `watch`: a Watch the driver built first (the Trainer's DDP reducer reads its parameters), else the session
        builds one."""
        self.scaler = scaler if scaler is not None and scaler.is_enabled() else None
        self.session = self.session_class(
            self, SessionPolicies.from_settings(settings, self.dialect, scaler=self.scaler, **policies), watch)
        self.watch, self.pinpointer = self.session.watch, self.session.pinpointer
        return self.session

    @property
    def history(self):
        return self.session.history

    def read_update(self):
        """The last update's parameter check, now (before a forward outside training: eval_forwards.py
        update_first) -> its Finding or None."""
        return self.session.finish()

    # -- the StepDriver methods (replay_loss is each subclass's) ---------------------------------------------
    def backward(self, loss: torch.Tensor, scaled: bool = True) -> None:
        """One micro-batch's backward as the run takes it: the loss's share of the step, times the fp16 scale when
        `scaled` (the fp16 probe replays it at scale 1)."""
        self.run_backward(self.share_of_step(loss), scaled)

    def share_of_step(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss a micro-batch back-propagates: divided by the accumulation (the frameworks divide always)."""
        return loss / self.accumulation_steps

    def run_backward(self, loss: torch.Tensor, scaled: bool) -> None:
        """The backward call itself, of `loss` times the fp16 scale when `scaled`."""
        self.scaled(loss, scaled).backward()

    def scaled(self, loss: torch.Tensor, scaled: bool = True) -> torch.Tensor:
        """`loss` times the GradScaler's scale when `scaled` and there is one, else `loss`."""
        return self.scaler.scale(loss) if scaled and self.scaler is not None else loss

    def optimizer_step(self, tape=None) -> None:
        """The update from accumulated (scaled) gradients, as the run takes it: unscale (unless done already),
        clip_gradients, step through the scaler (it skips non-finite gradients) and update its scale."""
        scaled_step(self.optimizer, self.scaler, self.clip_gradients)

    def clip_gradients(self) -> None:
        """The run's clipping of the true (unscaled) gradients: none unless the subclass clips."""

    def average_gradients(self) -> None:
        if self.dist is not None:
            average_gradients(self.watch.named_params, self.dist)

    def watch_paused(self):
        return self.watch.paused()
