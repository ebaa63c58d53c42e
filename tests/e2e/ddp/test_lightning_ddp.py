"""The Lightning callback under DDP: 2 CPU processes (gloo) launched by Lightning itself. A NaN born in rank 1's
backward, all-reduced to both ranks: rank 1 named, both stopped (a forward NaN on one rank: tests/e2e/ddp/
test_run_ddp.py and the CUDA tests of test_run_sharded_frameworks.py; one Lightning DDP job is CI's 20 s)."""

import json
import os
import subprocess
import sys

import pytest

from tests.support import SUPPORT

pytest.importorskip("lightning.pytorch")

from tests.conftest import REPO
from tests.support.ports import reserved_port

SCRIPT = SUPPORT / "frameworks" / "lightning_ddp.py"


def run(case: str, tmp_path) -> tuple[subprocess.CompletedProcess, dict]:
    with reserved_port() as port:  # Lightning's launcher takes MASTER_PORT when set (tests/support/ports.py)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
                   PYTHONUNBUFFERED="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        proc = subprocess.run([sys.executable, str(SCRIPT), case, str(tmp_path)], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=240)
    report = tmp_path / "r.json"
    return proc, json.loads(report.read_text()) if report.is_file() else {}


def test_backward_nan_on_rank_1_is_traced_to_rank_1_although_all_ranks_see_it(tmp_path):
    proc, report = run("backward_on_rank1", tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    f = report["first_nonfinite"]
    assert f["first_ranks"] == [0, 1]  # the all-reduced gradient is NaN on both ranks
    assert (f["rank"], f["step"], f["phase"], f["cause"]) == (1, 2, "backward", "grad_at_singularity")
    assert f["module"] == "" and "SqrtBackward" in f["backward_node"]
    assert report["integration"]["world_size"] == 2 and report["steps_run"] == 2 and f["micro_step"] == 1
    for rank in (0, 1):  # both stopped at the trip, both know the finding
        assert f"RANK {rank} status nonfinite global_step 2 finding (1, 2, 1, 'backward', 'grad_at_singularity')" \
            in proc.stdout, proc.stdout
    assert (tmp_path / "debug-nan-bundle-step2-micro1.pt").is_file()  # written by rank 1
