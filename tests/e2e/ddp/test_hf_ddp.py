"""The HF Trainer callback under torchrun: 2 CPU processes (gloo), DDP driven by the Trainer / accelerate."""

import json
import os
import socket
import subprocess
import sys

import pytest

from tests.support import SUPPORT

pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from tests.conftest import REPO

SCRIPT = SUPPORT / "frameworks" / "hf_ddp.py"


def test_nan_on_rank_1_stops_both_ranks_and_names_rank_1(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           f"--master_port={port}", "--master_addr=127.0.0.1", str(SCRIPT), str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    f = report["first_nonfinite"]
    assert report["integration"]["world_size"] == 2 and report["steps_run"] == 2
    assert (f["rank"], f["first_ranks"], f["step"], f["micro_step"]) == (1, [1], 2, 1)
    assert (f["phase"], f["op"], f["cause"]) == ("loss", "aten.div.Tensor", "div_by_zero")
    for rank in (0, 1):
        assert f"RANK {rank} status nonfinite global_step 2 finding (1, 2, 1, 'loss', 'div_by_zero')" in proc.stdout
    assert (tmp_path / "debug-nan-bundle-step2-micro1.pt").is_file()  # written by rank 1
