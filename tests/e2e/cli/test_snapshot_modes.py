"""--snapshot off | params through the CLI: what a run gives without the copy, or with the parameters only, and
--keep-going needs a copy."""


from debug_nan.engine.replay.snapshot import NO_OPTIMIZER_COPY, NO_SNAPSHOT
from tests.e2e.cli.test_scenarios import task


def test_cli_snapshot_off_gives_the_watch_only_finding(run_cli):
    run = run_cli(*task("log_zero_loss"), "--snapshot", "off")
    assert run.code == 1
    f = run.first
    assert (f["phase"], f["op"], f["cause"], f["detected_by"]) == ("loss", None, "unknown", "watch")
    assert NO_SNAPSHOT in f["explanation"] and f["bundle"] is None
    assert "snapshot off: no copy is kept" in run.output and run.report["settings"]["snapshot"] == "off"


def test_cli_snapshot_off_on_an_optimizer_trip_names_the_previous_step(run_cli):
    f = run_cli(*task("adam_eps_zero"), "--snapshot", "off").first
    assert (f["step"], f["phase"], f["cause"]) == (1, "optimizer", "unknown") and NO_SNAPSHOT in f["explanation"]


def test_cli_keep_going_needs_a_snapshot(run_cli):
    run = run_cli(*task("log_zero_loss"), "--snapshot", "off", "--keep-going")
    assert run.code == 2 and "--keep-going" in run.output and "--snapshot off" in run.output


def test_cli_snapshot_params_replays_a_loss_trip_and_reports_an_optimizer_trip_without_its_op(run_cli):
    run = run_cli(*task("log_zero_loss"), "--snapshot", "params")
    f = run.first
    assert run.code == 1 and (f["phase"], f["op"], f["detected_by"]) == ("loss", "aten.log.default", "replay")
    assert "params: parameters and buffers only" in run.output
    f = run_cli(*task("adam_eps_zero"), "--snapshot", "params").first
    assert (f["step"], f["phase"], f["cause"]) == (1, "optimizer", "unknown")
    assert NO_OPTIMIZER_COPY in f["explanation"]
