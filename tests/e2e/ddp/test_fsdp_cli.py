"""`python -m debug_nan ... --fsdp` on 2 ranks (started by hand: torchrun is not the subject, test_distributed.py's
torchrun jobs are): the CLI's own job with its model sharded by FSDP2 instead of wrapped in DDP (gloo, CPU). The
built-in pipeline runs clean on every rank; a planted overflow gives the finding the same job gives under DDP
(tests/e2e/ddp/test_run_ddp.py: step 3, the loss code's pow, rank 0 of 0 and 1)."""

import json

from tests.conftest import TINY
from tests.e2e.ddp.test_run_ddp import joined, ranks
from tests.support import SUPPORT


def test_the_builtin_pipeline_sharded_runs_clean_on_every_rank(tmp_path):
    proc = joined(ranks("--config", TINY, "--device", "cpu", "--max-steps", "2", "--gradient-accumulation-steps", "2",
                        "--fsdp", "--report", "r.json", cwd=tmp_path))
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "rank 0 of 2 (local rank 0), FSDP2 (--fsdp), gloo" in proc.stdout
    assert "fsdp: the model sharded with FSDP2 over 2 ranks" in proc.stdout
    data = json.loads((tmp_path / "r.json").read_text())
    assert (data["status"], data["steps_run"], data["first_nonfinite"]) == ("clean", 2, None)
    assert "CLEAN" in (tmp_path / "debug-nan-rank1.log").read_text()


def test_a_planted_overflow_under_fsdp_is_the_finding_ddp_gives(tmp_path):
    proc = joined(ranks("--task", f"{SUPPORT / 'run' / 'tasks.py'}:overflow_both", "--device", "cpu", "--max-steps",
                        "4", "--fsdp", "--report", "r.json", cwd=tmp_path))
    assert proc.returncode == 1, proc.stdout + proc.stderr[-3000:]
    first = json.loads((tmp_path / "r.json").read_text())["first_nonfinite"]
    assert (first["step"], first["micro_step"], first["phase"], first["op"], first["cause"], first["rank"],
            first["first_ranks"]) == (3, 1, "loss", "aten.pow.Tensor_Scalar", "overflow", 0, [0, 1])
    assert "no repro bundle: the model is sharded" in proc.stdout
