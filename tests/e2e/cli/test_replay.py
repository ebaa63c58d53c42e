"""`debug-nan replay`: it runs the task source stored in the bundle (and says so), says plainly when the file on
disk differs, leaves no temporary folder behind, and every failure is exit 2 with the error report."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from click.testing import CliRunner

from debug_nan.app.cli import main
from tests.support import FAULT_TASKS


def run_with_bundle(tmp_path) -> tuple[Path, dict]:
    task = tmp_path / "faults.py"
    task.write_text(FAULT_TASKS)
    out = CliRunner().invoke(main, ["--task", f"{task}:log_of_negative_in_batch_2", "--device", "cpu",
                                    "--max-steps", "3", "--report", str(tmp_path / "run.json"),
                                    "--bundle-dir", str(tmp_path)])
    assert out.exit_code == 1, out.output
    first = json.loads((tmp_path / "run.json").read_text())["first_nonfinite"]
    return task, first


def temp_task_folders() -> set[str]:
    return {p.name for p in Path(tempfile.gettempdir()).glob("debug-nan-task-*")}


def test_replay_uses_the_bundles_task_source_when_the_file_was_fixed(tmp_path):
    task, first = run_with_bundle(tmp_path)
    task.write_text(FAULT_TASKS.replace("torch.log(b[0, 0] + 2)", "torch.log(b[0, 0] + 4)"))  # the "fix"
    before = temp_task_folders()
    out = CliRunner().invoke(main, ["replay", first["bundle"], "--device", "cpu", "--report",
                                    str(tmp_path / "replay.json")])
    assert out.exit_code == 1, out.output
    assert f"the task file {task} on disk DIFFERS from the copy stored in the bundle" in out.output
    again = json.loads((tmp_path / "replay.json").read_text())
    assert (again["first_nonfinite"]["cause"], again["first_nonfinite"]["phase"]) == (first["cause"], first["phase"])
    assert "Same origin as recorded in the bundle." in again["notes"]
    assert again["first_nonfinite"]["source"] == first["source"]  # named at the file's own path and line
    assert temp_task_folders() == before


def test_replay_says_the_stored_copy_is_used_when_the_file_is_gone(tmp_path):
    task, first = run_with_bundle(tmp_path)
    task.unlink()
    out = CliRunner().invoke(main, ["replay", first["bundle"], "--device", "cpu"])
    assert out.exit_code == 1 and "is not on this machine; the replay uses the copy stored in the bundle" in out.output


def test_replay_log_over_the_bundle_is_refused_before_writing(tmp_path):
    _, first = run_with_bundle(tmp_path)
    blob = Path(first["bundle"]).read_bytes()
    out = CliRunner().invoke(main, ["replay", first["bundle"], "--log", first["bundle"], "--report",
                                    str(tmp_path / "r.json")])
    assert out.exit_code == 2 and "is the same file as the bundle" in out.output
    assert Path(first["bundle"]).read_bytes() == blob
    assert json.loads((tmp_path / "r.json").read_text())["exit_code"] == 2


def test_replay_of_a_bundle_whose_state_does_not_fit_is_exit_2_with_the_report(tmp_path):
    from tests.support.bundles import load, save_signed

    _, first = run_with_bundle(tmp_path)
    data = load(first["bundle"])
    data["task_source"] = data["task_source"].replace("T(nn.Linear(3, 1), batches, loss)",
                                                      "T(nn.Linear(3, 2), batches, loss)")
    save_signed(tmp_path / "edited.pt", data)
    out = CliRunner().invoke(main, ["replay", str(tmp_path / "edited.pt"), "--report", str(tmp_path / "r.json")])
    assert out.exit_code == 2 and "Traceback" not in out.output, out.output
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "error" and report["exit_code"] == 2 and "edited.pt" in report["error"]
