"""Only the CLI prints usage errors and exits: exit 2 is printed once and leaves the error report, for a bad task,
a bad config and a missing bundle. (The runner's own codes: tests/unit/app/test_exit_codes.py.)"""

import json

from click.testing import CliRunner

from debug_nan.app.cli import main
from tests.conftest import SCENARIOS


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
