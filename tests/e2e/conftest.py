"""The end-to-end layer: every test here runs a whole job through an entry point (the CLI's --task or built-in
task, `debug-nan run`, a framework's trainer, torchrun, a script of scripts/), in this process or a fresh one.
Each is marked `e2e` here, from its folder: `pytest -m "not e2e"` and `pytest tests/unit` are the same unit layer.

    cli/         `debug-nan ...` and `debug-nan replay`: tasks, data, checkpoints, bundles, outputs, exit codes
    run/         `debug-nan run -- COMMAND`: user-like scripts alone and watched
    frameworks/  the Lightning and HF Trainer callbacks, and the same bugs through every entry point (parity)
    ddp/         several processes: torchrun, gloo, mp.spawn
    process/     the console entry point as a process: signals, hang-ups, closed streams
    scripts/     the scripts of scripts/ (benchmarks, the GPU check, setup.sh, the remote script)
"""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from debug_nan.app.cli import main

HERE = Path(__file__).resolve().parent


def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)


class Run:
    def __init__(self, code: int, output: str, report: dict | None):
        self.code, self.output, self.report = code, output, report

    @property
    def first(self) -> dict:
        return self.report["first_nonfinite"]


@pytest.fixture
def run_cli(tmp_path, monkeypatch):
    """Run `debug-nan ARGS` in-process in an empty folder (no ./data), with --report; returns a Run."""
    monkeypatch.chdir(tmp_path)

    def run(*args: str) -> Run:
        report = tmp_path / "report.json"
        if report.exists():
            report.unlink()
        result = CliRunner().invoke(main, [*args, "--report", str(report)], catch_exceptions=False)
        data = json.loads(report.read_text()) if report.exists() and report.stat().st_size else None
        return Run(result.exit_code, result.output, data)

    return run
