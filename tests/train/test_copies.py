"""The state copied every few steps (engine/session/copies.py): every finding is the one an every-step copy gives.

A forward/backward trip between copies copies the live state (that step's start); an optimizer update that made a
parameter non-finite is replayed after re-running the steps since the copy (engine/replay/catch_up.py), checked bit for
bit against the watch's reading of the run's state; a loop whose update the replay does not know is told so."""

import time
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import debug_nan
from debug_nan.engine.replay.driver import StepInputs
from debug_nan.engine.watch.watch_result import MicroResult, Segment
from debug_nan.engine.session.copies import MAX_SNAPSHOT_EVERY, StateCopies
from tests.support import state_bugs
from tests.checks.test_state_bugs import task
from tests.support.frameworks import parity

FIELDS = ("step", "micro_step", "phase", "kind", "cause", "module", "op", "source_line")


def _first(run) -> dict:
    assert run.code == 1, run.output
    return {k: run.first[k] for k in FIELDS}


def test_a_nan_learning_rate_is_replayed_after_re_running_the_steps_since_the_copy(run_cli):
    """pytorch-semseg#186: the poly schedule's lr is NaN from step 5 on. Copies at steps 1 and 4 (every 3): the
    update of step 5 is replayed from step 4's copy, step 4 re-run with its own lr."""
    every_step = _first(run_cli(*task("poly_lr_past_its_end", "--max-steps", "6", "--snapshot-every", "1")))
    run = run_cli(*task("poly_lr_past_its_end", "--max-steps", "6", "--snapshot-every", "3"))
    assert _first(run) == every_step
    assert (every_step["step"], every_step["phase"], every_step["op"]) == (5, "optimizer", "aten.add_.Tensor")
    assert "re-running steps 4..4 from the copy taken at step 4, to the state before step 5" in run.output
    assert "LambdaLR set it after 4 of its steps" in run.first["explanation"]


@pytest.mark.parametrize("name", ["overflow_at_micro_2_of_2", "nan_batch", "every_label_ignored"])
def test_a_trip_between_copies_copies_the_live_state(run_cli, name):
    """Copies every 5 steps: the trips at steps 2 and 3 replay from a copy of the live state of their own step."""
    steps, accumulate = parity.BUGS.get(name, (3, 1))
    args = ("--task", f"{parity.__file__}:{name}", "--max-steps", str(steps), "--device", "cpu",
            "--gradient-accumulation-steps", str(accumulate))
    assert _first(run_cli(*args, "--snapshot-every", "5")) == _first(run_cli(*args, "--snapshot-every", "1"))


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
    assert "no copy of the state before step 7" in copies.at(StepInputs(step=7, batches=[]))


@pytest.mark.parametrize("name, steps", [("nan_batch", 5), ("explosion_by_lr", 4)])
def test_keep_going_goes_on_from_the_failing_steps_start_between_copies(run_cli, name, steps):
    """--keep-going skips the failing step's update: the run goes on from that step's start, whether a copy was
    taken at it (every step) or not (every third: the live state is copied then) -> the same losses after it."""
    def losses(every):
        run = run_cli("--task", f"{parity.__file__}:{name}", "--max-steps", str(steps), "--device", "cpu",
                      "--keep-going", "--snapshot-every", str(every))
        assert run.code == 1 and run.report["steps_run"] == steps, run.output
        return [h["loss"] for h in run.report["history"]]

    every_step = losses(1)
    assert len(every_step) == steps and losses(3) == every_step


def test_an_eval_pass_between_copies_keeps_the_reading_the_re_run_is_checked_against(run_cli):
    """The eval pass after step 4 reads the parameters of update 4 (the session's finish()): that reading is step
    5's, which the re-run from the copy at step 4 must reach."""
    args = task("poly_lr_past_its_end_evaluated", "--max-steps", "6", "--eval-every", "4")
    every_step = _first(run_cli(*args, "--snapshot-every", "1"))
    run = run_cli(*args, "--snapshot-every", "3")
    assert _first(run) == every_step and every_step["op"] == "aten.add_.Tensor"
    assert "re-running steps 4..4" in run.output


def test_without_an_optimizer_copy_nothing_is_re_run(run_cli):
    run = run_cli(*task("poly_lr_past_its_end", "--max-steps", "6", "--snapshot", "params", "--snapshot-every", "3"))
    assert (run.first["step"], run.first["phase"], run.first["op"]) == (5, "optimizer", None)
    assert "re-running" not in run.output and "no copy of the optimizer state (--snapshot params)" in run.output


def _refuse(*_args, **_kwargs):
    return "a re-run that did not reproduce the run (refused by the test)"


def test_keep_going_stops_where_the_state_before_the_update_cannot_be_rebuilt(run_cli, monkeypatch):
    """Going on from the older copy would drop the updates since it: --keep-going stops there instead."""
    monkeypatch.setattr("debug_nan.engine.session.copies.catch_up", _refuse)
    run = run_cli(*task("poly_lr_past_its_end", "--max-steps", "8", "--snapshot-every", "3", "--keep-going"))
    assert run.code == 1 and run.report["steps_run"] == 6 and len(run.report["findings"]) == 1, run.output
    assert (run.first["step"], run.first["phase"], run.first["op"]) == (5, "optimizer", None)
    assert "--keep-going: stopping at step 5" in run.output


def _interrupt(*_args, **_kwargs):
    raise KeyboardInterrupt("SIGTERM")


def test_an_interrupt_during_the_re_run_keeps_the_watchs_finding(run_cli, monkeypatch):
    monkeypatch.setattr("debug_nan.engine.session.copies.catch_up", _interrupt)
    run = run_cli(*task("poly_lr_past_its_end", "--max-steps", "6", "--snapshot-every", "3"))
    assert run.report["interrupted"] and run.report["status"] == "nonfinite", run.output
    assert (run.first["step"], run.first["phase"], run.first["watch"]) == (5, "optimizer", "param `0.weight` = nan")


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
