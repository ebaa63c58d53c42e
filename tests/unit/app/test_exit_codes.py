"""The runner (app/job.run_job) returns exit codes and raises InputError; it never prints a usage error nor exits
(the CLI does: tests/e2e/cli/test_exit_codes.py)."""

import io
import json

import pytest

from debug_nan.app.job import run_job
from debug_nan.errors import InputError
from debug_nan.app.job_settings import JobSettings
from tests.conftest import SCENARIOS


def settings(name: str, tmp_path, **kw) -> JobSettings:
    return JobSettings.from_flat(dict(task=f"{SCENARIOS}:{name}", device="cpu", max_steps=kw.pop("max_steps", 2),
                                      report=str(tmp_path / "r.json"), bundle=False, **kw))


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
    s = JobSettings.from_flat(dict(task=f"{SCENARIOS}:ddp_raises_before_forward", device="cpu", max_steps=4,
                                   bundle=False, report=str(tmp_path / "r.json")))
    assert run_job(s, stream=io.StringIO()) == 1
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "error" and "KeyError" in report["error"]


def test_bad_input_raises_instead_of_exiting(tmp_path):
    log_copy = tmp_path / "copy.log"
    s = JobSettings.from_flat(dict(task=f"{SCENARIOS}:not_a_task", device="cpu", log=str(log_copy)))
    with pytest.raises(InputError, match="is not a task"):
        run_job(s, stream=io.StringIO())
    assert "debug-nan: error: --task" in log_copy.read_text()  # the log copy keeps the message


def test_out_of_memory_outside_the_loop_is_bad_input_naming_what_to_lower(tmp_path):
    with pytest.raises(InputError, match="an allocation of 2.00 GiB failed.*lower the batch size"):
        run_job(settings("out_of_memory", tmp_path), stream=io.StringIO())
