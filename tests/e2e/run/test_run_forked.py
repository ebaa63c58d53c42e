"""A script that trains in a worker it forks (multiprocessing's "fork" start method), under `debug-nan run --
python SCRIPT`: forked before the parent created an optimizer, the worker is watched as its own process (its
finding named, its output as plain); forked after the parent began training, the worker's first training step is
refused with one paragraph naming the fork, exit 2 (never a hang, never the parent's watch state as its result)."""

import pytest

from tests.support import SUPPORT
from tests.support.run.side_by_side import watched

pytestmark = pytest.mark.processes  # the script forks a process

SCRIPT = str(SUPPORT / "run" / "forked.py")


def test_a_worker_forked_before_the_parent_trained_is_watched(tmp_path):
    done, report = watched(SCRIPT, "early", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stdout == "worker step 1 loss 1.353139\nworker step 2 loss 2.168657\n"  # stopped at step 3
    first = report["first_nonfinite"]
    assert (first["step"], first["phase"], first["op"], first["source"]) == (
        3, "loss", "aten.pow.Tensor_Scalar", "tests/support/models.py:80")
    assert report["integration"]["processes_watched"] == 1 and report["exit_code"] == 1


def test_a_worker_forked_after_the_parent_trained_is_refused_naming_the_fork(tmp_path):
    done, report = watched(SCRIPT, "late", cwd=tmp_path)
    assert done.returncode == 2, done.stderr
    assert done.stdout.count("parent step") == 4 and "worker step" not in done.stdout
    assert (report["status"], report["exit_code"]) == ("error", 2)
    forked = "was forked (os.fork, or multiprocessing's \"fork\" start method) from process"
    assert report["error"].startswith("process ") and forked in report["error"]
    assert "\"spawn\"" in report["error"] and done.stderr.count("=== SUMMARY ===") == 1
