"""The runner returns exit codes and raises InputError; only the cli prints usage errors and exits."""

import io
import json

import pytest
from click.testing import CliRunner

from debug_nan.app.cli import main
from debug_nan.app.job import run_job
from debug_nan.errors import InputError
from debug_nan.settings import RunSettings
from tests.conftest import SCENARIOS


def settings(name: str, tmp_path, **kw) -> RunSettings:
    return RunSettings(task=f"{SCENARIOS}:{name}", device="cpu", max_steps=kw.pop("max_steps", 2),
                       report=str(tmp_path / "r.json"), bundle=False, **kw)


@pytest.mark.parametrize("name, code, status", [
    ("healthy_masks", 0, "clean"),
    ("masked_softmax", 1, "nonfinite"),
    ("interrupted_at_step_2", 130, "clean"),
])
def test_run_job_returns_the_code(tmp_path, name, code, status):
    assert run_job(settings(name, tmp_path, max_steps=3), stream=io.StringIO()) == code
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == status and report["exit_code"] == code


def test_task_code_failing_is_exit_1_with_status_error(tmp_path):
    """A loss that raises with no NaN/Inf behind it: an error in the task's code, not a numerical finding."""
    assert run_job(settings("ddp_raises_before_forward", tmp_path, max_steps=1), stream=io.StringIO()) == 0
    s = RunSettings(task=f"{SCENARIOS}:ddp_raises_before_forward", device="cpu", max_steps=4, bundle=False,
                    report=str(tmp_path / "r.json"))
    assert run_job(s, stream=io.StringIO()) == 1
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "error" and "KeyError" in report["error"]


def test_bad_input_raises_instead_of_exiting(tmp_path):
    log_copy = tmp_path / "copy.log"
    s = RunSettings(task=f"{SCENARIOS}:not_a_task", device="cpu", log=str(log_copy))
    with pytest.raises(InputError, match="is not a task"):
        run_job(s, stream=io.StringIO())
    assert "debug-nan: error: --task" in log_copy.read_text()  # the log copy keeps the message


def test_out_of_memory_outside_the_loop_is_bad_input_naming_what_to_lower(tmp_path):
    with pytest.raises(InputError, match="an allocation of 2.00 GiB failed.*lower the batch size"):
        run_job(settings("out_of_memory", tmp_path), stream=io.StringIO())


def test_cli_exit_2_prints_once_and_leaves_an_error_report(tmp_path):
    report = tmp_path / "out" / "r.json"
    result = CliRunner().invoke(main, ["--task", f"{SCENARIOS}:bad_optimizer", "--device", "cpu", "--report",
                                       str(report)])
    assert result.exit_code == 2 and result.output.count("debug-nan: error:") == 1
    data = json.loads(report.read_text())
    assert data["status"] == "error" and data["exit_code"] == 2 and "optimizer(params)" in data["error"]


def test_cli_bad_config_is_exit_2_with_the_report_the_flag_asked_for(tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[model]\nlr = 1\n")
    result = CliRunner().invoke(main, ["--config", str(cfg), "--report", str(tmp_path / "r.json")])
    assert result.exit_code == 2 and "belongs in [train]" in result.output
    assert json.loads((tmp_path / "r.json").read_text())["status"] == "error"


def test_cli_replay_of_a_missing_bundle_is_exit_2(tmp_path):
    result = CliRunner().invoke(main, ["replay", str(tmp_path / "nope.pt"), "--report", str(tmp_path / "r.json")])
    assert result.exit_code == 2 and "does not exist" in result.output
    assert json.loads((tmp_path / "r.json").read_text())["exit_code"] == 2
