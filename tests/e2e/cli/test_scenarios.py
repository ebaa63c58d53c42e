"""Each numerical failure, through the CLI with --task and --report: the report must name the first origin."""

import pytest

from tests.conftest import SCENARIOS


def task(name: str) -> list[str]:
    return ["--task", f"{SCENARIOS}:{name}", "--device", "cpu"]


def test_masked_softmax_over_an_empty_row(run_cli):
    run = run_cli(*task("masked_softmax"), "--max-steps", "3")
    assert run.code == 1
    f = run.first
    assert (f["step"], f["micro_step"], f["phase"]) == (1, 1, "forward")
    assert (f["module"], f["module_type"]) == ("attn", "MaskedAttention")
    assert f["op"] == "aten._softmax.default" and f["kind"] == "nan" and f["cause"] == "all_masked_softmax"
    assert f["source"] == "tests/support/models.py:35"
    assert "6 of 24 rows whose 6 inputs were all -inf" in f["explanation"] and "s0_2" in f["explanation"]
    assert f["inputs"]["self"]["neginf"] == 3 * 6 * 2 + 6 * 6  # 2 padding keys per row of 3 samples + sample 2
    assert f["outputs"]["out"]["nan"] == 36
    assert f["suggestions"]
    assert "SUMMARY" in run.output and "cause        all_masked_softmax" in run.output


def test_log_of_zero_in_the_loss(run_cli):
    run = run_cli(*task("log_zero_loss"))
    f = run.first
    assert run.code == 1 and (f["phase"], f["module"], f["module_type"]) == ("loss", "", "")
    assert f["op"] == "aten.log.default" and f["kind"] == "inf" and f["cause"] == "log_of_nonpositive"
    assert f["source"].startswith("tests/support/scenarios.py:") and "torch.log(picked)" in f["source_line"]
    assert "11 values equal to 0" in f["explanation"]


def test_division_by_a_zero_sum(run_cli):
    f = run_cli(*task("div_by_zero_sum")).first
    assert (f["phase"], f["module"], f["module_type"]) == ("forward", "norm", "Normalizer")
    assert f["op"] == "aten.div.Tensor" and f["cause"] == "div_by_zero" and f["kind"] == "nan"
    assert "exactly 0 at 1 of 4 positions" in f["explanation"]


def test_sqrt_at_zero_is_finite_forward_nan_backward(run_cli):
    run = run_cli(*task("sqrt_distance"))
    f = run.first
    assert (f["phase"], f["cause"], f["backward_node"]) == ("backward", "grad_at_singularity", "SqrtBackward0")
    assert f["module_type"] == "Embedder" and f["source"] == f["forward_source"] == "tests/support/scenarios.py:131"
    assert "saved forward result is 0 at 5 of 25 positions" in f["explanation"]
    assert run.report["history"][0]["loss"] is None or run.report["history"][0]["loss"] != "nan"


def test_fp16_overflow_in_a_linear(run_cli):
    f = run_cli(*task("fp16_overflow"), "--precision", "fp16").first
    assert (f["phase"], f["module"], f["module_type"]) == ("forward", "proj", "Linear")
    assert f["op"] == "aten.addmm.default" and f["kind"] == "inf" and f["cause"] == "overflow"
    assert "float16 maximum 65504" in f["explanation"] and "1.263e+05" in f["explanation"]
    assert f["outputs"]["out"]["dtype"] == "float16"


def test_nan_already_in_the_targets(run_cli):
    f = run_cli(*task("nan_targets")).first
    assert (f["step"], f["phase"], f["cause"], f["op"]) == (2, "data", "nonfinite_input", None)
    assert "key `y` [6] holds 1 NaN" in f["explanation"] and "[[4]]" in f["explanation"]
    assert "b1s4" in f["explanation"]


def test_learning_rate_far_too_high_explodes_later(run_cli):
    run = run_cli(*task("high_lr"), "--lr", "3", "--max-steps", "10")
    f = run.first
    assert run.code == 1 and f["cause"] == "gradient_explosion" and f["step"] > 1
    norms = [h["grad_norm"] for h in run.report["history"]]
    assert norms[-1] > 1e4 and norms[0] < 10
    assert f["module"].startswith("layers.") and f["module_type"] == "Linear"
    assert "NONFINITE AHEAD" in run.output


def test_loss_that_raises_on_nan_still_names_the_origin(run_cli):
    run = run_cli(*task("raises_on_nan"), "--max-steps", "3")
    f = run.first
    assert run.code == 1 and run.report["status"] == "nonfinite"
    assert (f["step"], f["cause"], f["module"]) == (2, "all_masked_softmax", "attn")
    assert f["exception"].startswith("ValueError: NaN values found in predictions")


def test_right_micro_batch_under_accumulation_4(run_cli):
    run = run_cli(*task("accumulation"), "--gradient-accumulation-steps", "4", "--max-steps", "3")
    f = run.first
    assert (f["step"], f["micro_step"], f["cause"]) == (2, 3, "all_masked_softmax")
    assert f["sample_ids"] == ["s6_0", "s6_1", "s6_2", "s6_3"] and "s6_2" in f["explanation"]
    assert run.report["steps_run"] == 2


def test_healthy_model_with_inf_masks_is_clean(run_cli):
    run = run_cli(*task("healthy_masks"), "--max-steps", "4")
    assert run.code == 0 and run.report["status"] == "clean" and run.report["steps_run"] == 4


def test_nan_hidden_by_where_still_counts(run_cli):
    f = run_cli(*task("hidden_by_where")).first
    assert (f["phase"], f["op"], f["cause"]) == ("forward", "aten.log.default", "log_of_nonpositive")
    assert f["watch"].startswith("grad ")  # only the gradients showed it: the forward output was finite


def test_optimizer_that_divides_by_zero(run_cli):
    f = run_cli(*task("adam_eps_zero")).first
    assert (f["step"], f["phase"], f["cause"]) == (1, "optimizer", "nonfinite_parameter")
    assert f["op"] == "aten.addcdiv_.default" and "`unused_scale`" in f["explanation"]
    assert f["source"].startswith("torch/optim/adam.py:")


def test_factory_with_settings_and_dict_loss(run_cli):
    run = run_cli(*task("with_settings"), "--batch-size", "5", "--max-steps", "2")
    assert run.code == 0 and run.report["history"][0]["parts"]["mse"] > 0


def test_trace_every_step_prints_the_layer_trace(run_cli):
    run = run_cli(*task("healthy_masks"), "--max-steps", "1", "--trace-every-step")
    assert "layer-by-layer" in run.output
    assert "attn.qk (Linear): [4, 6, 16] float32, min" in run.output and "NaN 0 (0.00%)" in run.output


@pytest.mark.parametrize("spec, message", [
    ("nope.py:f", "does not exist"),
    ("tests/support/scenarios.py", "must be FILE.py:NAME"),
    ("tests/support/scenarios.py:missing", "has no attribute 'missing'"),
    ("tests/support/scenarios.py:D", "not a callable"),
    ("tests/support/scenarios.py:_mse", "calling it raised TypeError"),
])
def test_bad_task_specs_exit_2(run_cli, spec, message):
    import shutil

    shutil.copy(SCENARIOS, "scenarios_copy.py")
    run = run_cli("--task", spec.replace("tests/support/scenarios.py", str(SCENARIOS)), "--device", "cpu")
    assert run.code == 2 and message in run.output and "Traceback" not in run.output


def test_fp16_scaler_overflow_steps_are_not_findings(run_cli):
    run = run_cli(*task("fp16_scaler_overflow"), "--precision", "fp16", "--max-steps", "6")
    assert run.code == 0 and run.report["status"] == "clean", run.output
    skipped = [h["scaler_skipped"] for h in run.report["history"]]
    assert skipped[0] and not skipped[-1]  # skipped while the scale was too high, then training went on
    assert "gradient scaler overflow at scale 65536 (finite without the scale)" in run.output


def test_fp16_genuine_nan_gradient_is_a_finding(run_cli):
    """sqrt at 0 makes NaN gradients at any loss scale: not to be mistaken for a scaler overflow."""
    run = run_cli(*task("sqrt_distance"), "--precision", "fp16", "--max-steps", "5")
    assert run.code == 1 and run.first["cause"] == "grad_at_singularity" and run.first["step"] == 1


def test_fp16_gradient_beyond_range_even_unscaled_is_a_finding(run_cli):
    run = run_cli(*task("fp16_overflow"), "--precision", "fp16", "--max-steps", "3")
    assert run.code == 1 and run.first["cause"] == "overflow"
