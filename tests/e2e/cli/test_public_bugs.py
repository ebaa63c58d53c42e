"""Bugs reported in public projects (tests/support/public_bugs.py), through the CLI: healthy idioms stay clean, broken
ones are pinpointed at the origin derived from first principles (see each factory's docstring)."""

from tests.support import SUPPORT

BUGS = SUPPORT / "public_bugs.py"
AAM_WORDS = ("ASV", "--guards", "token-limited")


def task(name: str, *extra: str) -> list[str]:
    return ["--task", f"{BUGS}:{name}", "--device", "cpu", *extra]


def assert_generic(f: dict) -> None:
    text = f["explanation"] + " ".join(f["suggestions"])
    assert not any(w in text for w in AAM_WORDS), text


def test_where_hides_an_exp_overflow_in_forward_only(run_cli):  # pytorch/pytorch#68425
    run = run_cli(*task("where_exp_overflow"))
    f = run.first
    assert run.code == 1
    assert (f["step"], f["micro_step"], f["phase"]) == (1, 1, "forward")
    assert (f["module"], f["module_type"], f["op"]) == ("act", "SafeExp", "aten.exp.default")
    assert (f["kind"], f["cause"]) == ("inf", "overflow")
    assert "torch.exp(a)" in f["source_line"]
    assert f["watch"].startswith("grad ")  # the loss was finite: only a gradient showed it
    assert_generic(f)


def test_where_hides_a_sqrt_of_negatives(run_cli):  # pytorch/pytorch#187297
    f = run_cli(*task("where_sqrt_inactive")).first
    assert (f["phase"], f["module"], f["module_type"]) == ("forward", "0", "SqrtWhere")
    assert (f["op"], f["kind"], f["cause"]) == ("aten.sqrt.default", "nan", "invalid_domain")
    assert_generic(f)


def test_cross_entropy_with_every_target_ignored(run_cli):  # pytorch/pytorch#70348
    run = run_cli(*task("cross_entropy_all_ignored"), "--max-steps", "3")
    f = run.first
    assert run.code == 1 and (f["step"], f["micro_step"], f["phase"]) == (2, 1, "loss")
    assert (f["op"], f["kind"], f["cause"]) == ("aten.nll_loss_forward.default", "nan", "div_by_zero")
    assert "ignore_index" in f["explanation"] and "-100" in f["explanation"]
    assert_generic(f)


def test_ctc_of_an_infeasible_alignment_is_not_an_overflow(run_cli):  # pytorch/pytorch#31557
    f = run_cli(*task("ctc_infeasible")).first
    assert (f["phase"], f["op"], f["kind"]) == ("loss", "aten._ctc_loss.Tensor", "inf")  # lengths as tensors
    assert f["cause"] == "infeasible_target"
    assert "align" in f["explanation"]


def test_sdpa_with_a_fully_masked_padding_row_is_clean(run_cli):  # pytorch/pytorch#103749, fixed upstream
    run = run_cli(*task("sdpa_padding_row"), "--max-steps", "2")
    assert run.code == 0 and run.report["status"] == "clean", run.output


def test_naive_attention_with_a_fully_masked_padding_row(run_cli):  # pytorch/pytorch#103749, naive_fsdpa_1
    f = run_cli(*task("naive_padding_row")).first
    assert (f["phase"], f["module"], f["module_type"]) == ("forward", "attn", "PaddedAttention")
    assert (f["op"], f["kind"], f["cause"]) == ("aten._softmax.default", "nan", "all_masked_softmax")
    assert_generic(f)


def test_rl_invalid_action_masking_is_clean(run_cli):
    run = run_cli(*task("rl_masked_logits"), "--max-steps", "3")
    assert run.code == 0 and run.report["status"] == "clean", run.output
    assert "policy" in run.output and "-inf" in run.output  # reported as a note, not a finding


def test_rl_state_without_a_legal_action(run_cli):
    run = run_cli(*task("rl_no_legal_action"), "--max-steps", "3")
    f = run.first
    assert run.code == 1 and (f["step"], f["micro_step"]) == (2, 1)
    assert (f["op"], f["kind"], f["cause"]) == ("aten.sub.Tensor", "nan", "inf_arithmetic")
    assert f["exception"].startswith("ValueError")


def test_intentional_nan_consumed_by_nanmean_is_clean(run_cli):
    run = run_cli(*task("nanmean_padding"), "--max-steps", "2")
    assert run.code == 0 and run.report["status"] == "clean", run.output


def test_alibi_bias_module_with_minus_inf_output_is_clean(run_cli):
    run = run_cli(*task("alibi_bias"), "--max-steps", "2")
    assert run.code == 0 and run.report["status"] == "clean", run.output
    assert "`bias`" in run.output  # the note names the module whose output holds -inf


def test_variance_of_a_single_sample(run_cli):
    run = run_cli(*task("std_of_one"), "--max-steps", "3")
    f = run.first
    assert run.code == 1 and (f["step"], f["phase"]) == (3, "loss")
    assert (f["op"], f["kind"], f["cause"]) == ("aten.var.correction", "nan", "div_by_zero")
    assert "correction 1" in f["explanation"]


def test_complex_zero_divided_by_its_modulus(run_cli):
    f = run_cli(*task("complex_phase_at_zero")).first
    assert (f["phase"], f["module"], f["module_type"]) == ("forward", "phase", "PhaseNorm")
    assert (f["op"], f["kind"], f["cause"]) == ("aten.div.Tensor", "nan", "div_by_zero")


def test_complex_angle_at_zero_is_clean(run_cli):
    run = run_cli(*task("complex_angle_at_zero"), "--max-steps", "2")
    assert run.code == 0 and run.report["status"] == "clean", run.output
