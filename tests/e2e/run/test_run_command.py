"""How `debug-nan run` runs the user's command: a script, `python -m`, an installed console script; a script whose
own NaN check raises mid-step; --deterministic; no output over the command's files. (How the command is read:
tests/unit/app/test_command.py.)"""

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

RAISES = """import torch
from tests.support import models

torch.manual_seed(0)
model = models.Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for batch in models.batches(labels=True, empty_at=(2,)):
    loss = models.regression_loss(model, batch)
    if torch.isnan(loss):
        raise ValueError("the loss is NaN")
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""

PLAIN_TRAIN = """import torch
from tests.support import models

model = models.Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
models.regression_loss(model, models.batches(labels=True, n=1)[0]).backward()
print("never")
"""

KEYERROR = """import torch
from tests.support import models

torch.manual_seed(0)
model = models.Net()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for i, batch in enumerate(models.batches(labels=True)):
    loss = models.regression_loss(model, batch)
    batch["tokens"] if i == 2 else None
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""

ENTRY = "[console_scripts]\nmytrain = mytrain_main:main\n"
MAIN = """import torch
from tests.support import models


def main():
    torch.manual_seed(0)
    model = models.Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for batch in models.batches(labels=True, empty_at=(2,)):
        models.regression_loss(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad()
    return 0
"""


def test_a_script_raising_on_its_own_nan_check_gets_the_origin_behind_it(tmp_path, run_here):
    (tmp_path / "raises.py").write_text(RAISES)
    done, _, _ = run_here("python", "raises.py")
    assert done.code == 1, done.output
    first = done.first
    assert (first["step"], first["micro_step"], first["phase"], first["module"], first["op"], first["cause"]) == (
        3, 1, "forward", "attn", "aten._softmax.default", "all_masked_softmax")
    assert first["exception"] == "ValueError: the loss is NaN (at raises.py:10)"


@pytest.mark.parametrize("form", ["module", "console script"])
def test_python_m_and_a_console_script(tmp_path, run_here, monkeypatch, form):
    """`python -m mytrain_main` and an installed console script `mytrain` (a dist-info on the path, as pip
    writes it): the same loop inside main(), traced in place too."""
    (tmp_path / "mytrain_main.py").write_text(MAIN + "\nif __name__ == '__main__':\n    raise SystemExit(main())\n")
    info = tmp_path / "mytrain-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: mytrain\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{':'.join(sys.path)}")
    command = ["python", "-m", "mytrain_main"] if form == "module" else ["mytrain"]
    done, _, stderr = run_here(*command)
    assert done.code == 1, done.output
    assert (done.first["step"], done.first["op"], done.first["source"]) == (3, "aten._softmax.default",
                                                                          "tests/support/models.py:35")
    assert f"({'module' if form == 'module' else 'entry point'};" in stderr


def test_under_torchrun_a_script_without_a_process_group_is_refused_with_a_reason(tmp_path, run_here, monkeypatch):
    """RANK / WORLD_SIZE say torchrun, but the script trains without init_process_group: the ranks could not
    agree on a trip (tests/e2e/ddp/test_run_ddp.py runs real DDP scripts)."""
    (tmp_path / "train.py").write_text(PLAIN_TRAIN)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    done, stdout, stderr = run_here("python", "train.py")
    assert done.code == 2 and stdout == ""
    assert "under torchrun (WORLD_SIZE=2) the script trained without an initialised process group" in stderr
    assert done.report["status"] == "error"


def test_a_script_raising_mid_step_without_nan_is_its_own_failure(tmp_path, run_here):
    """No NaN/Inf before the exception (checked by the in-place replay): the script's traceback, status error, exit 1
    (as a --task whose loss raises)."""
    (tmp_path / "keyerror.py").write_text(KEYERROR)
    done, _, stderr = run_here("python", "keyerror.py")
    assert done.code == 1, done.output
    assert done.report["status"] == "error" and done.first is None
    assert "The replay found no NaN/Inf before it" in done.report["error"]
    assert 'keyerror.py", line 9, in <module>' in stderr and "KeyError: 'tokens'" in stderr


def test_deterministic_reaches_the_command_and_is_undone_after_it(tmp_path, run_here):
    import torch

    (tmp_path / "check.py").write_text("import torch\nprint(torch.are_deterministic_algorithms_enabled())\n")
    done, stdout, stderr = run_here("python", "check.py", options=("--deterministic",))
    assert done.code == 2 and stdout == "True\n"  # (it trains nothing: exit 2, said so)
    assert "without training" in stderr
    assert not torch.are_deterministic_algorithms_enabled()


def test_a_script_that_acts_differently_the_second_time_still_gets_its_op(tmp_path, run_here):
    """No second run: a script that would behave otherwise when run again (a file its first run wrote) is
    pinpointed from the state this run holds, the op named."""
    once = RAISES.replace("import torch\n", "import os\nimport sys\nimport torch\n\nif os.path.exists('done'):\n"
                          "    sys.exit(0)\nopen('done', 'w').close()\n").replace(
        "    if torch.isnan(loss):\n        raise ValueError(\"the loss is NaN\")\n", "")
    (tmp_path / "once.py").write_text(once)
    done, _, stderr = run_here("python", "once.py")
    assert done.code == 1, done.output
    assert (done.first["step"], done.first["micro_step"], done.first["op"], done.first["cause"]) == (
        3, 1, "aten._softmax.default", "all_masked_softmax")


def test_no_output_is_written_over_the_command_or_its_files(tmp_path, run_here):
    """--report naming the script, and a usage error whose only --report is the user's own (after `--`): exit 2,
    and the script and the user's results file are untouched."""
    from click.testing import CliRunner

    from debug_nan.app.cli import main

    (tmp_path / "train.py").write_text(RAISES)
    (tmp_path / "results.json").write_text('{"mine": 1}')
    result = CliRunner().invoke(main, ["run", "--report", "train.py", "--", "python", "train.py"])
    assert result.exit_code == 2 and "train.py" in result.output
    assert (tmp_path / "train.py").read_text() == RAISES
    result = CliRunner().invoke(main, ["run", "--max-steps", "0", "--", "python", "train.py", "--report",
                                       "results.json"])
    assert result.exit_code == 2
    assert (tmp_path / "results.json").read_text() == '{"mine": 1}'


def test_an_interrupted_pinpoint_keeps_the_watch_finding(tmp_path, run_here, monkeypatch):
    """Ctrl-C while the failing micro-batch is replayed under the tracer: the trip the watch saw is reported (no
    op), the run is marked interrupted, exit 130."""
    from debug_nan.engine.replay.pinpoint import Pinpointer

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt()

    monkeypatch.setattr(Pinpointer, "replay", interrupted)
    quiet = RAISES.replace("    if torch.isnan(loss):\n        raise ValueError(\"the loss is NaN\")\n", "")
    assert quiet != RAISES
    (tmp_path / "nan.py").write_text(quiet)
    done, _, stderr = run_here("python", "nan.py")
    assert done.code == 130, done.output
    assert (done.report["status"], done.report["interrupted"], done.report["exit_code"]) == ("nonfinite", True, 130)
    assert (done.first["step"], done.first["op"], done.first["detected_by"]) == (3, None, "watch")
    assert "the op-level replay was interrupted (Ctrl-C) before it named the op" in " ".join(
        done.first["explanation"].split())


def test_the_summary_of_a_run_says_the_exit_code_it_has(tmp_path, run_here):
    """debug-nan run decides the process's exit code itself: its summary says it, as the CLI's does."""
    (tmp_path / "raises.py").write_text(RAISES)
    done, _, stderr = run_here("python", "raises.py")
    assert done.code == 1 and done.report["exit_code"] == 1
    assert "was born here (exit 1)" in stderr
