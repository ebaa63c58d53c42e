import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from debug_nan.app.cli import main
from debug_nan.aam.data.synthetic import synthesize
from tests.support import REPO, SUPPORT

TINY = str(REPO / "configs" / "tiny.toml")
SCENARIOS = SUPPORT / "scenarios.py"


# modules whose every test runs the tool end to end (a subprocess, torchrun, a script)
E2E_MODULES = {"test_cli", "test_distributed", "test_remote_script", "test_benchmarks", "test_bundle"}


def pytest_collection_modifyitems(items):
    """Mark the end-to-end tests (through the CLI or a subprocess) `e2e`: `pytest -m "not e2e"` is the fast
    unit layer."""
    for item in items:
        if "run_cli" in getattr(item, "fixturenames", ()) or item.module.__name__.rsplit(".", 1)[-1] in E2E_MODULES:
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DEBUG_NAN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    # log lines unwrapped, so that tests find messages that name long temporary paths on one line; the tests of
    # the 100-column log (tests/report/test_log_width.py) set the width back
    monkeypatch.setenv("DEBUG_NAN_LOG_WIDTH", "0")


@pytest.fixture(autouse=True)
def _distribution_validation_restored():
    """torch.compile's first call turns torch.distributions' argument validation off for the whole process
    (torch/_dynamo/eval_frame.py): a test that compiles must not change what a later test's Categorical raises."""
    import torch

    validate = torch.distributions.Distribution._validate_args
    yield
    torch.distributions.Distribution.set_default_validate_args(validate)


@pytest.fixture(scope="session")
def tiny_data():
    """24 samples, richness 3..48 ASVs against a token limit of 24."""
    return synthesize(24, 24, seed=3)


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


def run_process(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """The real console entry point in a fresh process."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "debug_nan", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=timeout)
