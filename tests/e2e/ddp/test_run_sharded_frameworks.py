"""`torchrun -m debug_nan run` of sharded Lightning and Accelerate scripts, unmodified (tests/support/run/
lightning_sharded.py, accelerate_sharded.py): Lightning's FSDPStrategy (FSDP1) and ModelParallelStrategy (FSDP2),
Accelerate's FSDP plugin at fsdp_version 1 and 2. CUDA only (Lightning refuses FSDPStrategy on the CPU; Accelerate
shards only on GPUs): NCCL, one GPU per rank, 2 ranks where 2 GPUs exist, else 1. scripts/gpu_check.py runs them
(gpu_check_items.CUDA_TESTS). And, on the CPU, Lightning's DDPStrategy, whose forward redirection FSDPStrategy
shares.

Healthy: exit 0, the report clean, the script's own output (rank 0's loss per micro-batch) byte for byte.
masked: batch 3's sample 2 has no valid key, so its softmax row in `attn` is 0/0 = NaN in the forward, on the rank
batch 3 is dealt to (rank r trains on batches r, r + N, ...): rank 1's second micro-batch (step 2) with 2 ranks, the
only rank's fourth (step 4) with 1 (one process: no rank reported). Rank 0's loss stays finite, its gradients go
NaN through FSDP's reduce-scatter: rank 1 alone is first to see it.
"""

import json
import subprocess

import pytest
import torch

from tests.e2e.ddp import test_run_ddp
from tests.support import SUPPORT

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: Lightning refuses FSDP on the "
                                "CPU and Accelerate shards only on GPUs (scripts/gpu_check.py runs these)")
LIGHTNING = str(SUPPORT / "run" / "lightning_sharded.py")
ACCELERATE = str(SUPPORT / "run" / "accelerate_sharded.py")
# the model the watch holds is the module whose forward the training step calls: the LightningModule inside
# FSDPStrategy's wrapper, `net` under ModelParallelStrategy (its training_step calls self.net), Accelerate's Net
MODULE = {"fsdp": "net.attn", "model_parallel": "attn", "1": "attn", "2": "attn"}
def ranks() -> int:
    return min(2, torch.cuda.device_count())


def torchrun(*args: str, cwd) -> subprocess.CompletedProcess:
    return test_run_ddp.torchrun(*args, cwd=cwd, timeout=300, nproc=ranks())


def watched(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "run.json"
    done = torchrun("-m", "debug_nan", "run", "--report", str(report), "--", *args, cwd=tmp_path)
    return done, json.loads(report.read_text()) if report.is_file() else {}


def script_of(framework: str, strategy: str) -> list[str]:
    """The command's words after `--`, the framework imported here first (or the test skipped without it)."""
    pytest.importorskip("lightning.pytorch" if framework == "lightning" else "accelerate")
    return [LIGHTNING if framework == "lightning" else ACCELERATE, strategy]


CASES = [("lightning", "fsdp"), ("lightning", "model_parallel"), ("accelerate", "1"), ("accelerate", "2")]


@needs_cuda
@pytest.mark.parametrize("framework, strategy", CASES)
def test_a_healthy_sharded_framework_run_prints_exactly_its_own_output(tmp_path, framework, strategy):
    words = script_of(framework, strategy)
    alone = torchrun(*words, cwd=tmp_path)
    done, report = watched(tmp_path, *words)
    assert alone.returncode == 0 and done.returncode == 0, done.stderr[-3000:]
    assert done.stdout == alone.stdout and alone.stdout.count("\n") == 3  # rank 0's three micro-batches
    assert (report["status"], report["steps_run"], report["first_nonfinite"]) == ("clean", 3, None)
    assert "debug-nan itself failed" not in done.stderr and "without training" not in done.stderr


@needs_cuda
@pytest.mark.parametrize("framework, strategy", CASES)
def test_a_nan_born_on_rank_1_is_named_on_rank_1_at_its_op(tmp_path, framework, strategy):
    two = ranks() == 2
    done, report = watched(tmp_path, *script_of(framework, strategy), "--bug", "masked", "--steps", "4")
    assert done.returncode != 0 and report.get("status") == "nonfinite", done.stderr[-3000:]
    first = report["first_nonfinite"]
    assert (first["step"], first["micro_step"], first["phase"], first["module"], first["module_type"]) == (
        2 if two else 4, 1, "forward", MODULE[strategy], "MaskedAttention")
    assert (first["op"], first["cause"]) == ("aten._softmax.default", "all_masked_softmax")
    assert (first["rank"], first["first_ranks"]) == ((1, [1]) if two else (None, None))
    assert first["source"] == "tests/support/models.py:35"  # MaskedAttention's softmax line
    if two:  # the ranks replayed together: the model was sharded (DDP's ranks replay alone)
        assert "every rank replays with them (the model is sharded)" in done.stderr


def test_lightnings_ddp_strategy_redirects_forward_and_the_replay_does_too(tmp_path):
    """DDPStrategy (as FSDPStrategy) runs training_step as the LightningModule's forward only for the call of its
    wrapper (Lit has no forward of its own): the replay redirects it the same way. CPU, gloo, 2 ranks."""
    pytest.importorskip("lightning.pytorch")
    done = test_run_ddp.torchrun("-m", "debug_nan", "run", "--report", str(tmp_path / "run.json"), "--", LIGHTNING,
                                 "ddp", "--accelerator", "cpu", "--bug", "masked", "--steps", "4", cwd=tmp_path,
                                 timeout=300)
    first = json.loads((tmp_path / "run.json").read_text())["first_nonfinite"]
    assert done.returncode != 0 and "NotImplementedError" not in done.stderr, done.stderr[-3000:]
    assert (first["step"], first["phase"], first["module"], first["op"], first["rank"], first["first_ranks"]) == (
        2, "forward", "net.attn", "aten._softmax.default", 1, [1])
    assert done.stdout == "batch 0 loss 1.353139\nbatch 1 loss 1.638563\n"
