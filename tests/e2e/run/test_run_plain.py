"""`debug-nan run -- python plain_loop.py`: an unmodified training loop, healthy (its stdout byte for byte, its
exit code) and broken (the finding equals the `--task` finding for the same model, tests/support/run/tasks.py)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import run_process
from tests.support import SUPPORT

HERE = SUPPORT / "run"
SCRIPT = str(HERE / "plain_loop.py")
TASKS = str(HERE / "tasks.py")
FIELDS = ("step", "micro_step", "phase", "module", "module_type", "op", "cause", "kind", "source")


def plain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=120)


def watched(tmp_path, *args: str, options=()) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "run.json"
    done = run_process("run", "--report", str(report), *options, "--", "python", SCRIPT, *args, cwd=tmp_path)
    return done, json.loads(report.read_text())


@pytest.fixture(scope="session")
def loop_alone():
    """`python plain_loop.py --exit-code 3` (healthy), once: the reference of the tests below."""
    return plain("--exit-code", "3")


@pytest.mark.processes
def test_healthy_loop_prints_exactly_its_own_output_and_keeps_its_exit_code(tmp_path, loop_alone):
    """In a fresh process: the exit code is the process's."""
    done, report = watched(tmp_path, "--exit-code", "3")
    assert loop_alone.returncode == 3 and done.returncode == 3, done.stderr
    assert done.stdout == loop_alone.stdout and loop_alone.stdout.count("\n") == 4
    assert (report["status"], report["steps_run"], report["first_nonfinite"], report["exit_code"]) == (
        "clean", 4, None, 3)
    assert "[debug-nan] watching Net (225 parameters) and its AdamW" in done.stderr


def test_max_steps_stops_the_command_with_a_clean_summary(run_here, loop_alone):
    done, stdout, stderr = run_here("python", SCRIPT, options=("--max-steps", "2"))
    assert done.code == 0, stderr
    assert stdout == "".join(loop_alone.stdout.splitlines(keepends=True)[:2])
    assert (done.report["status"], done.report["steps_run"]) == ("clean", 2)
    assert "--max-steps 2: the command was stopped after that many optimizer steps" in stderr


@pytest.mark.parametrize("bug, task, accumulate, where", [
    ("masked", "masked", 2, (2, 2)),  # NaN at micro-batch 2 of 2
    ("overflow", "overflow", 1, (4, 1)),
    ("unlabelled", "unlabelled", 1, (4, 1)),  # every label of a batch ignored: 0 / 0
    ("lr", "high_lr", 1, (2, 1)),  # lr 1000: the gradient history trips before any overflow
])
def test_broken_loop_same_finding_as_the_task(run_here, run_cli, bug, task, accumulate, where):
    done, stdout, stderr = run_here("python", SCRIPT, "--bug", bug, "--accumulate", str(accumulate), "--lr",
                                    "1000" if bug == "lr" else "0.01")
    assert done.code == 1 and done.report["exit_code"] == 1, done.output
    assert "training failed" not in stdout  # the script's `except Exception` did not swallow the stop
    first = done.first
    assert (first["step"], first["micro_step"]) == where
    cli = run_cli("--task", f"{TASKS}:{task}", "--device", "cpu", "--max-steps", "6", "--no-bundle",
                  "--gradient-accumulation-steps", str(accumulate))
    assert cli.code == 1, cli.output
    assert {k: first[k] for k in FIELDS} == {k: cli.first[k] for k in FIELDS}
    if first["op"] is not None:  # traced in place, from the run's own state, and said so
        assert f"[pinpoint] replaying step {where[0]} micro-batch {where[1]} from the snapshot" in stderr
    assert done.report["integration"]["pinpoint"].startswith("in place")


def test_a_script_seeded_from_the_clock_gets_the_op_of_its_seeded_twin(run_here):
    """No second run: the replay starts from this run's own state, so a data order or noise from the OS does not
    hide the op (a re-execution would differ from the run)."""
    seeded, _, _ = run_here("python", SCRIPT, "--bug", "masked")
    done, _, stderr = run_here("python", SCRIPT, "--bug", "masked", "--unseeded-noise")
    assert done.code == 1 and seeded.code == 1, done.output
    fields = ("step", "micro_step", "phase", "module", "op", "cause", "kind", "source")
    assert {k: done.first[k] for k in fields} == {k: seeded.first[k] for k in fields}
    assert done.first["op"] == "aten._softmax.default" and done.first["cause"] == "all_masked_softmax"


BAD = {
    "missing": None,
    "raises": "raise FileNotFoundError('data/train.csv')\n",
    "no_optimizer": "import torch\nprint(torch.nn.Linear(2, 2)(torch.ones(2)).sum().item() != 0)\n",
    "late_optimizer": (  # an optimizer created after training began, for a model the first does not hold
        "import torch\n"
        "g, d = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)\n"
        "og = torch.optim.SGD(g.parameters(), lr=0.1)\n"
        "for _ in range(2):\n"
        "    g(torch.ones(2)).sum().backward(); og.step()\n"
        "od = torch.optim.SGD(d.parameters(), lr=0.1)\n"
        "d(torch.ones(2)).sum().backward(); od.step()\n"),
}


@pytest.mark.parametrize("case, words", [
    ("missing", "the script {script} does not exist"),
    ("raises", "the command raised FileNotFoundError: data/train.csv (at {script}:1) before any training step"),
    ("no_optimizer", "the command ended (exit 0) without training"),
    ("late_optimizer", "the script steps an optimizer debug-nan run does not watch (SGD) beside the SGD"),
])
def test_bad_input_one_paragraph_exit_2_and_the_error_report(tmp_path, run_here, case, words):
    script = tmp_path / f"{case}.py"
    if BAD[case] is not None:
        script.write_text(BAD[case])
    done, _, stderr = run_here("python", script.name)
    assert done.code == (1 if case == "raises" else 2), done.output  # the script's own error: 1, as plain Python
    assert done.report["exit_code"] == done.code
    assert words.format(script=script.name) in " ".join(stderr.split())
    assert done.report["status"] == "error"
    assert words.format(script=script.name) in " ".join(done.report["error"].split())
    if case == "raises":  # the script's own traceback, as Python prints it
        assert f'File "{script}", line 1, in <module>' in stderr
