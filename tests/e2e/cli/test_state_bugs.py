"""NaN that lives in state, from public reports (tests/support/state_bugs.py), through the CLI: each bug is
pinpointed at the origin derived from first principles in its factory's docstring, and its fixed version is clean."""

import pytest

from tests.support import SUPPORT

BUGS = SUPPORT / "state_bugs.py"


def task(name: str, *extra: str) -> list[str]:
    return ["--task", f"{BUGS}:{name}", "--device", "cpu", *extra]


@pytest.mark.parametrize("name, extra", [
    ("vqvae_ema_smoothed", ()), ("running_var_biased", ("--eval-every", "2")), ("conv_input_normalised", ()),
    ("vae_logvar_clamped", ("--explosion-threshold", "1e12")), ("weight_norm_random_init", ()),
    ("target_normaliser_biased", ()),
])
def test_fixed_versions_are_clean(run_cli, name, extra):
    run = run_cli(*task(name, "--max-steps", "3", *extra))
    assert run.code == 0 and run.report["status"] == "clean", run.output
    assert "turned NAN" not in run.output and "turned INF" not in run.output


def test_ema_codebook_dead_code_names_the_step_that_wrote_the_buffer(run_cli):
    """zalandoresearch/pytorch-vq-vae#5, rosinality/vq-vae-2-pytorch#72, ZhangXInFD/SpeechTokenizer#18."""
    run = run_cli(*task("vqvae_ema_dead_code", "--max-steps", "3"))
    f = run.first
    assert run.code == 1 and (f["step"], f["micro_step"], f["phase"]) == (1, 1, "forward")
    assert (f["module"], f["module_type"], f["op"]) == ("vq", "EmaCodebook", "aten.div.Tensor")
    assert (f["kind"], f["cause"]) == ("nan", "div_by_zero")
    assert "embed_sum / size" in f["source_line"]
    assert f["watch"] == "loss `<loss>` = nan"  # the harm came a step later
    assert "wrote buffer `vq.embed` at step 1, micro-batch 1" in f["explanation"]
    assert "at step 2, micro-batch 1 it reached the harm" in f["explanation"]
    assert "an earlier step wrote it" not in run.output


def test_running_variance_of_one_sample_is_named_in_training_not_in_eval(run_cli):
    """facebookresearch/SparseConvNet#190, torch/nn#1271."""
    run = run_cli(*task("running_var_of_one_sample", "--max-steps", "3", "--eval-every", "2"))
    f = run.first
    assert run.code == 1 and (f["step"], f["micro_step"], f["phase"]) == (2, 1, "forward")
    assert (f["module"], f["module_type"], f["op"]) == ("1", "RunningNorm", "aten.var.correction")
    assert (f["kind"], f["cause"]) == ("nan", "div_by_zero")
    assert "correction 1" in f["explanation"] and "the eval pass after step 2" in f["explanation"]


def test_inf_into_a_training_batch_norm_names_the_convolution(run_cli):
    """pytorch/pytorch#90342."""
    f = run_cli(*task("conv_overflow_into_batch_norm", "--max-steps", "3")).first
    assert (f["step"], f["phase"], f["module"], f["module_type"]) == (2, "forward", "0", "Conv2d")
    assert (f["op"], f["kind"], f["cause"]) == ("aten.convolution.default", "inf", "overflow")
    assert "buffer" not in f["explanation"]
    assert "an intermediate (a partial sum or product) exceeded the float32 maximum" in f["explanation"]


def test_poly_schedule_past_its_end_names_the_nan_learning_rate(run_cli):
    """meetps/pytorch-semseg#186."""
    run = run_cli(*task("poly_lr_past_its_end", "--max-steps", "6"))
    f = run.first
    assert run.code == 1 and (f["step"], f["phase"], f["kind"]) == (5, "optimizer", "nan")
    assert f["op"] == "aten.add_.Tensor" and f["source_line"] == "param.add_(grad, alpha=-lr)"
    assert "The learning rate is nan in optimizer.param_groups[0]" in f["explanation"]
    assert "optimizer.defaults still says 0.01" in f["explanation"]
    assert "LambdaLR set it after 4 of its steps" in f["explanation"]
    assert f["suggestions"][0].startswith("Fix the schedule (LambdaLR)")
    assert not any("Lower the learning rate" in s for s in f["suggestions"])


def test_poly_schedule_clamped_is_clean(run_cli):
    run = run_cli(*task("poly_lr_clamped", "--max-steps", "6"))
    assert run.code == 0 and run.report["status"] == "clean", run.output


@pytest.mark.parametrize("poison, name, phase", [
    ("weight", "0.weight", "optimizer"), ("adam", "0.weight (optimizer exp_avg_sq)", "optimizer"),
])
def test_nan_loaded_from_a_checkpoint_is_named_as_the_checkpoints(run_cli, tmp_path, poison, name, phase):
    """Rikorose/DeepFilterNet#30, NVIDIA-NeMo/RL#3544, NVIDIA/tacotron2#283."""
    from tests.support.state_bugs import save_checkpoint

    path = tmp_path / f"{poison}.pt"
    save_checkpoint(path, poison)
    run = run_cli(*task("resumed_model", "--max-steps", "3", "--checkpoint", str(path)))
    f = run.first
    assert run.code == 1 and (f["step"], f["phase"], f["module"], f["cause"]) == (8, phase, "0", "nonfinite_parameter")
    assert f"`{name}` [8, 8] holds 1 NaN" in f["explanation"]
    assert f"loaded from --checkpoint {path} before step 8, the first step of this run" in f["explanation"]
    assert f["suggestions"][0].startswith("The checkpoint file itself holds the NaN/Inf")
    assert "Lower the learning rate" not in " ".join(f["suggestions"]) and "earlier step wrote" not in run.output


def test_a_healthy_checkpoint_resumes_clean(run_cli, tmp_path):
    from tests.support.state_bugs import save_checkpoint

    save_checkpoint(tmp_path / "ok.pt", None)
    run = run_cli(*task("resumed_model", "--max-steps", "3", "--checkpoint", str(tmp_path / "ok.pt")))
    assert run.code == 0 and run.report["status"] == "clean", run.output


def test_exp_of_a_huge_log_variance_is_an_overflow_even_past_float64(run_cli):
    """vanderschaarlab/synthcity#331."""
    f = run_cli(*task("vae_logvar_exp_overflow", "--max-steps", "3", "--explosion-threshold", "1e12")).first
    assert (f["step"], f["phase"], f["module"], f["module_type"]) == (2, "forward", "", "Vae")
    assert (f["op"], f["kind"], f["cause"]) == ("aten.exp.default", "inf", "overflow")
    assert "overflow past float64's range as well" in f["explanation"] and "std = torch.exp" in f["source_line"]


def test_weight_norm_of_a_zero_row_is_named_from_its_inputs(run_cli):
    """pytorch/pytorch#19126."""
    f = run_cli(*task("weight_norm_zero_row", "--max-steps", "2")).first
    assert (f["step"], f["phase"], f["kind"]) == (1, "forward", "nan")
    assert f["module"].startswith("2.") and f["op"] == "aten._weight_norm_interface.default"
    assert f["cause"] == "div_by_zero" and "has 1 all-zero slices along dim 0 (of 3)" in f["explanation"]


def test_every_label_ignored_advises_about_the_data_first(run_cli):
    """huggingface/trl#1820 (the response template never matches: every label -100)."""
    run = run_cli(*task("completion_labels_all_ignored", "--max-steps", "4"))
    f = run.first
    assert run.code == 1 and (f["step"], f["phase"], f["op"]) == (1, "loss", "aten.nll_loss_forward.default")
    assert (f["kind"], f["cause"]) == ("nan", "div_by_zero")
    assert f["suggestions"][0].startswith("Fix the data first: every label of this micro-batch is ignore_index")
    assert "`num_items_in_batch`" in f["suggestions"][1]
    assert not any(s.startswith(("Add an epsilon", "std/var")) for s in f["suggestions"])


def test_a_clamped_count_trains_on_nothing_and_says_so(run_cli):
    run = run_cli(*task("completion_labels_all_ignored_clamped", "--max-steps", "4"))
    assert run.code == 0 and run.report["status"] == "clean", run.output
    assert run.report["warnings"] == [w for w in run.report["warnings"] if "exactly 0 in steps 1..4" in w] != []
    assert "warning      the total gradient norm was exactly 0 in steps 1..4" in run.output


def test_every_step_skipped_by_the_fp16_scaler_is_a_warning(run_cli):
    """pytorch/pytorch#67590."""
    run = run_cli(*task("scaler_skips_every_step", "--max-steps", "3", "--precision", "fp16"))
    assert run.code == 0 and run.report["status"] == "clean", run.output
    assert len(run.report["warnings"]) == 1 and "skipped every step (1..3)" in run.report["warnings"][0]


@pytest.mark.parametrize("name, extra", [("completion_template_found", ()),
                                         ("scaler_mean_loss", ("--precision", "fp16"))])
def test_fixed_versions_have_no_warning(run_cli, name, extra):
    run = run_cli(*task(name, "--max-steps", "4", *extra))
    assert run.code == 0 and run.report["warnings"] == [], run.output


def test_a_running_variance_overflowing_quietly_is_a_note_and_a_warning(run_cli):
    """pytorch/pytorch#90342, the quiet half: nothing harmful, but a buffer turned Inf and an output is near it."""
    run = run_cli(*task("conv_large_input_quietly_poisons_running_var", "--max-steps", "3"))
    assert run.code == 0 and run.report["status"] == "clean", run.output
    assert any(n.startswith("buffer `1.running_var` turned INF at step 2, micro-batch 1, written by "
                            "aten.native_batch_norm.default in forward (module `1`)") for n in run.report["notes"])
    assert run.report["warnings"] and run.report["warnings"][0].startswith("`0` output reached max |x| = 2.94e+30")


def test_evidence_agrees_with_the_module_output_note(run_cli):
    run = run_cli(*task("dropped_head_output", "--max-steps", "2"))
    f = run.first
    assert (f["phase"], f["module"], f["op"], f["cause"]) == ("forward", "head", "aten.exp.default", "overflow")
    assert "The loss stayed finite although module output `head` held the value" in f["explanation"]
    assert "hidden before any module output" not in f["explanation"]
    assert any(n.startswith("`head` output holds +inf in step 2") for n in run.report["notes"])


def test_the_bundle_of_a_buffer_writers_finding_replays_as_recorded(run_cli, tmp_path):
    run = run_cli(*task("vqvae_ema_dead_code", "--max-steps", "3"))
    bundle = run.first["bundle"]
    again = run_cli("replay", bundle)
    assert again.code == 1, again.output
    assert any(n.startswith("The recorded origin, aten.div.Tensor at step 1, wrote buffer `vq.embed`")
               for n in again.report["notes"]), again.output


def test_a_buffer_written_after_the_optimizer_step_is_a_note_without_a_made_up_op(run_cli):
    run = run_cli(*task("buffer_written_after_the_step", "--max-steps", "4"))
    assert run.code == 0 and run.report["status"] == "clean", run.output
    (note,) = [n for n in run.report["notes"] if n.startswith("buffer `avg`")]
    assert note.startswith("buffer `avg` turned INF at step 3, micro-batch 1, not traced: it was non-finite already "
                           "when step 3 began, so it was written outside a forward and loss"), note


def test_a_target_normaliser_poisoned_by_one_sample_names_that_step(run_cli):
    """pokaxpoka/B_Pref#3."""
    run = run_cli(*task("target_normaliser_one_sample", "--max-steps", "4"))
    f = run.first
    assert run.code == 1 and (f["step"], f["micro_step"], f["phase"]) == (2, 1, "forward")
    assert (f["module"], f["module_type"], f["op"]) == ("norm", "TargetNormaliser", "aten.var.correction")
    assert (f["kind"], f["cause"]) == ("nan", "div_by_zero")
    assert "wrote buffer `norm.var` at step 2" in f["explanation"] and "at step 3, micro-batch 1" in f["explanation"]


def test_inf_into_a_batch_norm_under_fp16_autocast(run_cli):
    """pytorch/pytorch#90342 as reported (AMP): the fp16 convolution overflows, not the buffer, not the cast."""
    run = run_cli(*task("conv_overflow_into_batch_norm_fp16", "--max-steps", "3", "--precision", "fp16"))
    f = run.first
    assert run.code == 1 and (f["step"], f["phase"], f["module"]) == (2, "forward", "0")
    assert (f["op"], f["kind"], f["cause"]) == ("aten.convolution.default", "inf", "overflow")
    assert "the float16 maximum 65504" in f["explanation"]


def test_a_buffer_written_in_an_earlier_micro_batch_of_the_same_step(run_cli):
    run = run_cli(*task("vqvae_ema_dead_code", "--max-steps", "3", "--gradient-accumulation-steps", "2"))
    f = run.first
    assert run.code == 1 and (f["step"], f["micro_step"], f["op"]) == (1, 1, "aten.div.Tensor")
    assert "at step 1, micro-batch 2 it reached the harm" in f["explanation"]


def test_a_weight_non_finite_before_the_first_step_is_not_blamed_on_an_earlier_step(run_cli):
    run = run_cli(*task("nan_initialised_weight", "--max-steps", "2"))
    f = run.first
    assert run.code == 1 and (f["step"], f["module"], f["cause"]) == (1, "2", "nonfinite_parameter")
    assert "`2.weight` [1, 8] holds 8 NaN" in f["explanation"]
    assert "before step 1, the first step of this run" in f["explanation"] and "earlier step" not in f["explanation"]
    assert f["suggestions"][0].startswith("The model was non-finite before its first step")
