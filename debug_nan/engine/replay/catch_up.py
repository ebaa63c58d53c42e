"""Bring a snapshot forward: from the state it holds (the start of step M) to the start of a later step N, by
re-running steps M..N-1 exactly as the run took them, then checking the result against the run's own reading.

Why: copying the parameters and optimizer state before every step costs as much memory traffic as an Adam step
(7-8% of a GPT-2-like CPU step). The session saves the copy only every few steps (engine/session/session.py) and, for
the one trip that needs the state before an EARLIER step (an optimizer update that made a parameter non-finite, seen at
the next step's first sync), re-runs the steps since the copy here. A trip in a forward or backward needs no
re-run: mid-step the live parameters and optimizer state are the step's own, and the session copies them then.

Each re-run step: its recorded hyperparameters (the lr its schedule set, and the scheduler's state), each
micro-batch with its RNG state (forward, loss, backward, as the run), the gradients averaged (DDP), the driver's
optimizer step (unscale, clip, step). The state reached must match the watch's own reading of the run's state at
step N's first sync (one sum or L2 norm per parameter and optimizer state tensor, compared exactly; a reading,
not the whole state: a difference that leaves every reading unchanged, or one in a buffer, would pass): a script
whose steps do not reproduce (non-deterministic kernels, an update the driver does not know about) is told so, and
the optimizer step is then not replayed, rather than replayed from a state the run never had.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from debug_nan.engine.replay.driver import NotReplayable, StepDriver, StepInputs
from debug_nan.engine.replay.snapshot import put_groups, restore_rng
from debug_nan.engine.stats import move_to


def _apply(hyper: dict | None, optimizer, scheduler) -> None:
    """A step's snapshot.schedule_state, as it began, back into the optimizer and scheduler."""
    if hyper is None:
        return
    put_groups(optimizer, hyper["groups"])
    if scheduler is not None and hyper["scheduler"] is not None:
        scheduler.load_state_dict(hyper["scheduler"])


@dataclass(frozen=True)
class Reached:
    """Whether the state was brought to a step's start (here, and by engine/session/copies.py's StateCopies.at):
    `ok`, else `why` not, in words."""

    ok: bool
    why: str = ""


REACHED = Reached(True)


def missed(why: str) -> Reached:
    return Reached(False, why)


def catch_up(driver: StepDriver, chain: list[StepInputs], fingerprint) -> Reached:
    """Restore the snapshot of chain[0] and re-run chain[:-1] -> REACHED when the state reached is chain[-1]'s
    start (its recorded `fingerprint`), else why not. `fingerprint()`: the watch's reading of the live state,
    (names, values). The caller saves the state reached; on failure the live state is left as the re-run left it
    (the caller restores what it needs)."""
    target = chain[-1]
    if target.fingerprint is None:
        return missed(f"the state at the start of step {target.step} was never read by the watch, so a re-run to "
                      f"it could not be checked")
    d, snapshot = driver, chain[0].snapshot
    scheduler = snapshot.scheduler
    snapshot.restore()
    with d.watch_paused():
        try:
            for inputs in chain[:-1]:
                _apply(inputs.hyper, d.optimizer, scheduler)
                for i, batch in enumerate(inputs.batches):
                    restore_rng(inputs.rng[i], d.device)
                    loss, _ = d.replay_loss(move_to(batch, d.device, copy=True), inputs.tape(i))
                    d.backward(loss)
                d.average_gradients()
                if inputs.step_groups is not None:
                    put_groups(d.optimizer, inputs.step_groups)
                d.optimizer_step(inputs.update)
                if d.optimizer is not None:
                    d.optimizer.zero_grad(set_to_none=True)
        except NotReplayable as why:
            return missed(f"the steps since the copy taken at step {chain[0].step} cannot be re-run: {why}")
        _apply(target.hyper, d.optimizer, scheduler)
    names, values = fingerprint()
    want_names, want = target.fingerprint
    if names != want_names or not np.array_equal(values, want):
        differs = ", ".join([n for n, a, b in zip(names, values, want) if a != b][:3]) or "its tensors differ"
        return missed(f"re-running steps {chain[0].step}..{target.step - 1} from the copy taken at step "
                      f"{chain[0].step} did not reproduce the watch's reading of the run's state at step "
                      f"{target.step} ({differs}): the steps are not deterministic, or the update does more than the "
                      f"optimizer step the replay knows")
    return REACHED


__all__ = ["REACHED", "Reached", "catch_up", "missed"]
