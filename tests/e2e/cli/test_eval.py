"""--eval-every: the validation pass runs as the user's does (eval(), no_grad, torch's fused fast paths), its
NaN is pinpointed in phase `eval` with the fused op named, and the model comes back in its training flags."""

from pathlib import Path

import pytest

from tests.conftest import TINY
from tests.support.tasks import eval_task

TASK = Path(eval_task.__file__)


def args(name: str, *more: str) -> list[str]:
    return ["--task", f"{TASK}:{name}", "--device", "cpu", "--no-bundle", *more]


def test_pyt_8_9_as_it_happened_training_finite_first_eval_pass_not(run_cli):
    """--asv-encoder torch --no-guards: every ASV slot goes through nn.TransformerEncoder; training (composite
    path) stays finite, the first eval pass (fused fast path) turns all-padding slots into NaN."""
    base = ("--config", TINY, "--asv-encoder", "torch", "--no-guards", "--device", "cpu", "--no-bundle")
    run = run_cli(*base, "--eval-every", "2", "--max-steps", "4")
    assert run.code == 1, run.output
    f = run.first
    assert (f["phase"], f["step"], f["micro_step"]) == ("eval", 2, 1)
    assert f["op"] == "aten._transformer_encoder_layer_fwd.default"
    assert f["module"] == "asv_encoder.transformer.encoder.layers.0"
    assert f["module_type"] == "TransformerEncoderLayer"
    assert f["cause"] == "all_masked_softmax"
    assert "masks every one of the 151 keys of 16 rows of 96" in f["explanation"]
    assert "positions 10..23 of sample S7" in f["explanation"]
    assert run.report["steps_run"] == 2  # two finite training steps came first
    clean = run_cli(*base, "--max-steps", "4")
    assert clean.code == 0, clean.output  # the same training without the eval pass: finite
    guarded = run_cli("--config", TINY, "--asv-encoder", "torch", "--device", "cpu", "--eval-every", "2",
                      "--max-steps", "2")
    assert guarded.code == 0 and "[eval] after step 2: 1 held-out batch(es)" in guarded.output


def test_a_tasks_own_transformer_encoder_fast_path_in_eval(run_cli):
    run = run_cli(*args("pre_norm", "--eval-every", "3", "--max-steps", "5"))
    assert run.code == 1, run.output
    f = run.first
    assert (f["phase"], f["step"], f["micro_step"]) == ("eval", 3, 2)  # the second held-out batch has the empty row
    assert f["op"] == "aten._transformer_encoder_layer_fwd.default" and f["cause"] == "all_masked_softmax"
    assert "keys of 1 rows of 4" in f["explanation"] and "belong to samples #2." in f["explanation"]
    # the loss skips padding positions and stays finite: the predictions the validation returns carry the NaN
    assert "held-out batch 2: `logits` read nan" in run.output


def test_nested_tensor_fast_path_gives_the_empty_row_zeros_and_stays_clean(run_cli):
    """torch 2.13 CPU: with nested tensors (norm_first=False) the all-padding row is dropped by
    _nested_tensor_from_mask and padded back with zeros: no NaN, so no finding (but the final pass ran)."""
    run = run_cli(*args("post_norm", "--eval-every", "2", "--max-steps", "3"))
    assert run.code == 0, run.output
    assert "[eval] after step 2: 2 held-out batch(es)" in run.output
    assert "[eval] after step 3: 2 held-out batch(es)" in run.output  # the final pass


def test_eval_every_without_held_out_batches_is_exit_2(run_cli):
    run = run_cli(*args("without_eval_batches", "--eval-every", "2"))
    assert run.code == 2 and "has no held-out batches; give it `eval_batches`" in run.output


@pytest.mark.parametrize("flag", ["--eval-batches", "--eval-samples"])
def test_eval_options_need_eval_every(run_cli, flag):
    run = run_cli(*args("pre_norm", flag, "2"))
    assert run.code == 2 and "runs only with --eval-every N" in run.output
