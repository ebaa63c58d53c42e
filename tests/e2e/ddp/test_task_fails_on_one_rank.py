"""A task that fails on one rank only under torchrun goes through the ranks' agreement: every rank stops."""

from __future__ import annotations

import json

from tests.support import FAULT_TASKS


def test_task_failing_on_one_rank_under_torchrun_goes_through_the_agreement(tmp_path):
    """Rank 1's factory raises: both ranks exit 2 together and rank 0 writes the error report naming rank 1."""
    from tests.e2e.ddp.test_distributed import assert_every_rank_exited, torchrun

    (tmp_path / "faults.py").write_text(FAULT_TASKS)
    proc, seconds = torchrun("--task", "faults.py:fails_on_rank_1", "--device", "cpu", "--report", "r.json",
                             cwd=tmp_path)
    assert proc.returncode != 0, proc.stdout + proc.stderr  # torchrun's own code is 1
    assert_every_rank_exited(proc, "2")  # both workers exited 2, none was killed
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["exit_code"] == 2 and "rank 1 could not set up the run" in report["error"]
    assert "ValueError: rank 1 cannot open its shard" in report["error"]
