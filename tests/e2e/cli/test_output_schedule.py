"""When module outputs are measured, through the CLI: the notes and step lines say which steps were measured, a
finding is the same when its trip step was not measured, and a negative stride is refused."""

import pytest

from tests.support import SUPPORT

BUGS = SUPPORT / "public_bugs.py"


def task(name: str, *extra: str) -> list[str]:
    return ["--task", f"{BUGS}:{name}", "--device", "cpu", *extra]


def test_cli_notes_and_step_lines_say_which_steps_were_measured(run_cli):
    run = run_cli(*task("rl_masked_logits"), "--max-steps", "7", "--outputs-every", "3")
    assert run.code == 0 and run.report["status"] == "clean", run.output
    text = " ".join(run.output.split())
    assert "`policy` output holds -inf in every step whose outputs were measured (3 of steps 1..7)" in text
    assert run.output.count("module outputs not measured in this step") == 4  # steps 2, 3, 5, 6
    history = {r["step"]: r for r in run.report["history"]}
    assert history[1]["max_abs_activation"] and "outputs_measured" not in history[1]
    assert history[2]["outputs_measured"] is False and history[2]["max_abs_activation"] == {}
    assert all(history[s]["loss"] is not None for s in range(1, 8))  # the checks that trip ran in every step
    assert run.report["history_kept"].endswith("module outputs (max_abs_activation) measured in 3 of the 7 steps")


@pytest.mark.parametrize("name, steps", [("cross_entropy_all_ignored", "3"), ("rl_no_legal_action", "3")])
def test_cli_finding_is_the_same_when_the_trip_step_is_not_measured(run_cli, name, steps):
    every = run_cli(*task(name, "--max-steps", steps, "--outputs-every", "1")).first
    strided = run_cli(*task(name, "--max-steps", steps, "--outputs-every", "4")).first  # step 2 not measured
    keys = ("step", "micro_step", "phase", "module", "op", "kind", "cause", "source_line")
    assert every["step"] == 2
    assert {k: strided[k] for k in keys} == {k: every[k] for k in keys}


def test_cli_refuses_a_negative_stride(run_cli):
    run = run_cli(*task("rl_masked_logits"), "--outputs-every", "-1")
    assert run.code == 2 and "--outputs-every must be >= 0" in run.output
