"""`torchrun --nproc_per_node=2 -m debug_nan run -- shard_script.py`: a sharded pretraining script (FSDP2's
`fully_shard`, FSDP1, gloo, CPU) watched on every rank. Healthy (under torchrun): its output byte for byte and exit
0. Broken (its 2 ranks started by hand, `python -m debug_nan run` each: torchrun is not what these test, and its
launcher is a process more per job; test_run_ddp.py's `ranks`, whose every rank must end on its own): the
ranks replay the trip together (FSDP's all-gathers and reduce-scatters run again in the replay), and the finding
names the step, phase, module (as the user wrote it: no `_fsdp_wrapped_module.`), op and the rank that made the
first non-finite value."""

import json

import pytest

from tests.e2e.ddp import test_run_ddp
from tests.support import SUPPORT

SCRIPT = str(SUPPORT / "run" / "shard_script.py")


def torchrun(*args: str, cwd):
    return test_run_ddp.torchrun(*args, cwd=cwd, timeout=300)


def watched(tmp_path, *args: str):
    """The 2 ranks started by hand -> (the job as one process: test_run_ddp.joined, rank 0's report)."""
    report = tmp_path / "run.json"
    done = test_run_ddp.ranks("run", "--report", str(report), "--", SCRIPT, *args, cwd=tmp_path)
    return test_run_ddp.joined(done), json.loads(report.read_text())


def test_a_healthy_fsdp2_run_prints_exactly_its_own_output(tmp_path):
    alone = torchrun(SCRIPT, "--shard", "fsdp2", cwd=tmp_path)
    report = tmp_path / "run.json"
    done = torchrun("-m", "debug_nan", "run", "--report", str(report), "--", SCRIPT, "--shard", "fsdp2", cwd=tmp_path)
    data = json.loads(report.read_text())
    assert alone.returncode == 0 and done.returncode == 0, done.stderr
    assert done.stdout == alone.stdout and alone.stdout.count("\n") == 4
    assert (data["status"], data["steps_run"], data["exit_code"], data["first_nonfinite"]) == ("clean", 4, 0, None)
    assert "without training" not in done.stderr and "debug-nan itself failed" not in done.stderr


@pytest.mark.parametrize("shard", ["fsdp2", "fsdp2-linear", "fsdp1"])
def test_a_huge_learning_rate_is_named_with_the_user_s_module_names(tmp_path, shard):
    done, data = watched(tmp_path, "--shard", shard, "--bug", "lr")
    assert done.returncode != 0 and done.stdout == "step 1 loss 1.752029\n", done.stderr
    first = data["first_nonfinite"]
    # both ranks' forwards overflow, each replay names the op (not the garbage FSDP's all-gather buffers held
    # before the collective wrote them): the first rank is named
    assert (first["step"], first["micro_step"], first["phase"], first["first_ranks"]) == (2, 1, "forward", [0, 1])
    assert first["rank"] == 0 and all("aten.mm.default" in first["rank_origins"][r] for r in ("0", "1"))
    assert (first["module"], first["module_type"], first["op"], first["cause"], first["kind"]) == (
        "cascade_stages.0.encoder.self_attn", "MultiheadAttention", "aten.mm.default", "overflow", "inf")
    assert "_fsdp_wrapped_module" not in done.stderr
    assert "[bundle] no repro bundle: the model is sharded" in done.stderr


def test_an_explosion_grown_on_rank_1_alone_names_rank_1(tmp_path):
    """DDP averages the gradients, so every rank's norms explode at the same step: the rank is the one whose own
    loss grew (rank 1's targets grow tenfold every 3 steps; rank 0's data stays the same)."""
    done, data = watched(tmp_path, "--shard", "ddp", "--bug", "grow", "--steps", "20")
    assert done.returncode != 0, done.stderr
    first = data["first_nonfinite"]
    assert (first["step"], first["cause"], first["detected_by"], first["module"]) == (
        12, "gradient_explosion", "gradient history", "head")
    assert (first["rank"], first["first_ranks"]) == (1, [1])
    assert "It comes from rank 1: its own loss grew" in first["explanation"]
    assert "rank 1 (first to see it: rank(s) 1)" in done.stderr and done.stdout.count("\n") == 11


@pytest.mark.parametrize("shard", ["ddp", "fsdp1"])  # (FSDP1 with a gathered loss: AAM's own `pretrain --fsdp`)
def test_a_value_gathered_from_rank_1_in_the_loss_is_followed_to_rank_1s_op(tmp_path, shard):
    """The loss all_gathers every rank's outputs (the local slice kept in the graph): rank 1's forward overflows
    at step 3 and every rank's loss is NaN. Rank 0's replay finds the gathered value already non-finite; rank 1's
    names the op that made it."""
    done, data = watched(tmp_path, "--shard", shard, "--bug", "corrupt", "--gather-loss")
    assert done.returncode != 0, done.stderr
    first = data["first_nonfinite"]
    assert (first["step"], first["phase"], first["rank"], first["first_ranks"]) == (3, "forward", 1, [0, 1])
    assert (first["module"], first["op"], first["cause"]) == (
        "cascade_stages.0.encoder.self_attn", "aten._scaled_dot_product_flash_attention_for_cpu.default", "overflow")
    assert "Rank(s) 0 saw it too, already non-finite when their own code first used it: they received rank 1's" \
        in first["explanation"]
    origins = first["rank_origins"]  # each rank's own origin is kept: rank 0 received it in the loss code
    assert origins["0"].startswith("loss (no op) in `<loss code>`") and "nonfinite_input" in origins["0"]
    assert origins["1"].startswith("forward aten._scaled_dot_product_flash_attention_for_cpu.default")


def test_a_nan_only_the_gradients_carry_is_followed_through_fsdp1s_reduce_scatter_to_rank_1s_op(tmp_path):
    """AAM's own `--fsdp` shape: rank 1's forward makes log(0) = -inf and drops it with torch.where; only its
    gradients go NaN (0 / 0 in log's backward), and FSDP1's reduce-scatter (gloo: a reduced copy, then split) makes
    every rank's NaN. Rank 1's gradients carry its own share through the collective: its op is named."""
    done, data = watched(tmp_path, "--shard", "fsdp1", "--bug", "hidden")
    assert done.returncode != 0 and done.stdout == "step 1 loss 1.752651\n", done.stderr
    first = data["first_nonfinite"]
    assert (first["step"], first["phase"], first["rank"], first["first_ranks"]) == (2, "forward", 1, [0, 1])
    assert (first["module"], first["op"], first["cause"]) == ("", "aten.log.default", "log_of_nonpositive")
    assert first["rank_origins"]["1"].startswith("forward aten.log.default in `<model root>` at ")
    assert "the run's kernels computed it otherwise" not in first["explanation"]


def test_a_nan_learning_rate_under_fsdp2_is_the_watch_s_finding_with_the_reason(tmp_path):
    """The optimizer step over DTensors is not traced yet: every rank stops together with the watch's finding, the
    reason said, and no rank fails (the failure of one rank's replay used to be raised as a TypeError on the others:
    RunAborted did not survive its broadcast)."""
    done, data = watched(tmp_path, "--shard", "fsdp2", "--bug", "nan-lr")
    assert done.returncode != 0 and "debug-nan itself failed" not in done.stderr, done.stderr
    first = data["first_nonfinite"]
    assert (data["status"], first["step"], first["phase"], first["rank"], first["first_ranks"]) == (
        "nonfinite", 2, "optimizer", 0, [0, 1])
    assert first["detected_by"] == "watch" and "the op-level tracer does not follow an optimizer step over sharded" \
        in first["explanation"]
