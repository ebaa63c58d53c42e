"""An out-of-memory replay keeps the watch's finding, through the CLI. (The pinpointer through its StepDriver
seam: tests/unit/engine/replay/test_pinpoint.py.)"""

from pathlib import Path

from tests.support.tasks import users_run


def test_out_of_memory_in_the_replay_through_the_cli(run_cli):
    run = run_cli("--task", f"{Path(users_run.__file__)}:replay_out_of_memory", "--device", "cpu", "--max-steps", "2")
    assert run.code == 1, run.output
    f = run.first
    assert (f["step"], f["phase"], f["detected_by"]) == (1, "loss", "watch")
    assert "ran out of memory" in f["explanation"] and "Tried to allocate 8.00 GiB" in f["explanation"]
