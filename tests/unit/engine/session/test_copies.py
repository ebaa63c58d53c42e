"""The state copied every few steps (engine/session/copies.py): the interval chosen from what a copy costs, the
chain of copies, and the Monitor's findings between copies: an optimizer update that made a parameter non-finite is
replayed after re-running the steps since the copy, checked bit for bit against the watch's reading of the run's
state; a loop whose update the replay does not know is told so. (Through the CLI: tests/e2e/cli/test_copies.py.)"""

import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import debug_nan
from debug_nan.engine.replay.driver import StepInputs
from debug_nan.engine.session.copies import MAX_SNAPSHOT_EVERY, StateCopies
from debug_nan.engine.watch.watch_result import MicroResult, Segment
from tests.support import state_bugs


def _poly_loop(every: int, after_step=None):
    """The poly-schedule bug in a loop the user owns, under the Monitor -> its NonFiniteError's finding."""
    t = state_bugs.poly_lr_past_its_end()
    optimizer = t.optimizer(t.model.parameters())
    scheduler = t.scheduler(optimizer)
    monitor = debug_nan.Monitor(t.model, t.loss, optimizer, snapshot_every=every)
    with pytest.raises(debug_nan.NonFiniteError) as info:
        for batch in t.batches:
            with monitor.step(batch) as watched:
                loss = t.loss(t.model, batch)
                watched.watch_loss(loss)
                loss.backward()
            optimizer.step()
            if after_step is not None:
                after_step(t.model)
            scheduler.step()
            optimizer.zero_grad()
    return info.value.finding, t.model


def test_the_monitor_re_runs_the_steps_since_the_copy():
    every_step, _ = _poly_loop(1)
    finding, model = _poly_loop(3)
    assert (finding.step, finding.phase, finding.op, finding.source_line) == \
        (every_step.step, every_step.phase, every_step.op, every_step.source_line) == \
        (5, "optimizer", "aten.add_.Tensor", "param.add_(grad, alpha=-lr)")


def test_an_update_the_replay_does_not_know_is_not_replayed_from_a_wrong_state():
    """The loop shrinks the weights after every optimizer step: the re-run (the optimizer step alone) does not
    reach the run's state, so the optimizer step is reported without an op rather than traced from it."""
    def shrink(model):
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.999)

    finding, _ = _poly_loop(3, after_step=shrink)
    assert _poly_loop(1, after_step=shrink)[0].op == "aten.add_.Tensor"  # copied every step: nothing to re-run
    assert (finding.step, finding.phase) == (5, "optimizer")
    assert finding.op is None
    assert "did not reproduce the watch's reading of the run's state at step 5" in finding.explanation
    assert "the op was not replayed" in finding.explanation


class _SlowCopy:
    """A snapshot whose copy takes 40 ms."""

    kept = keeps_optimizer = True
    scheduler = None

    def stage(self):
        pass

    def save(self, live_buffers=False):
        time.sleep(0.04)


def test_the_interval_is_chosen_from_what_a_copy_costs():
    lines = []
    copies = StateCopies(_SlowCopy(), SimpleNamespace(optimizer=None), None, lambda line, *a: lines.append(line),
                         None, adaptive=True)
    clean = MicroResult([Segment("loss", [""], np.array([1.0]), np.array([False]))])
    for step in (1, 2):
        copies.begin(step)
        copies.first_sync(clean, blames_last_update=False)
        copies.stepped()
    # step 2's copy is timed against step 1 (which held a copy too): a 40 ms copy in a step of about 40 ms is far
    # above 1%, so the longest interval
    assert copies.every == MAX_SNAPSHOT_EVERY and copies.saved.step == 2
    assert "it is taken every 16 steps" in lines[0]
    for step in range(3, 19):
        copies.begin(step)
        copies.first_sync(clean, blames_last_update=False)
        copies.stepped()
        assert copies.saved.step == (2 if step < 18 else 18)
    assert copies.since == []
    fixed = StateCopies(_SlowCopy(), SimpleNamespace(optimizer=None), None, print, 2, adaptive=True)
    saved = []
    for step in range(1, 6):
        fixed.begin(step)
        fixed.first_sync(clean, blames_last_update=False)
        saved.append(fixed.saved.step)
    assert saved == [1, 1, 3, 3, 5] and fixed.every == 2


def test_a_step_not_in_the_chain_cannot_be_reached():
    copies = StateCopies(_SlowCopy(), SimpleNamespace(optimizer=None), None, print, 1, adaptive=False)
    reached = copies.at(StepInputs(step=7, batches=[]))
    assert not reached.ok and "no copy of the state before step 7" in reached.why


def test_a_nan_written_after_the_optimizer_step_is_not_blamed_on_it():
    """The loop writes a NaN into the weights after step 3's optimizer step (a renormalisation dividing by 0):
    the update replayed stays finite, and the finding says the value was made outside the optimizer step."""
    def renormalise(model):
        if renormalise.calls == 3:
            with torch.no_grad():
                model[0].weight.div_(model[0].weight.norm() * 0)
        renormalise.calls += 1

    renormalise.calls = 1
    finding, _ = _poly_loop(1, after_step=renormalise)
    assert (finding.step, finding.phase, finding.op) == (3, "optimizer", None)
    assert "made non-finite after it and before step 4 began, by code outside the optimizer step" in \
        finding.explanation and "non-deterministic" not in finding.explanation
