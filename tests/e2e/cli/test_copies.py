"""The state copied every few steps (engine/session/copies.py), through the CLI: every finding is the one an
every-step copy gives. A forward/backward trip between copies copies the live state (that step's start); an
optimizer update that made a parameter non-finite is replayed after re-running the steps since the copy
(engine/replay/catch_up.py); --keep-going goes on between copies; an interrupt during the re-run keeps the watch's
finding. (The copies' own mechanics, on the Monitor and by hand: tests/unit/engine/session/test_copies.py.)"""


import pytest

from debug_nan.engine.replay.catch_up import missed
from tests.e2e.cli.test_state_bugs import task
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
    return missed("a re-run that did not reproduce the run (refused by the test)")


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
