import json
import sys

import pytest
import torch
from click.testing import CliRunner

from debug_nan.app.cli import main
from tests.e2e.conftest import Run
from tests.support.run.side_by_side import TRAIN, plain


@pytest.fixture
def run_here(tmp_path, monkeypatch):
    """`debug-nan run --report REPORT OPTIONS -- COMMAND` in this process, in tmp_path -> (Run, stdout, stderr).
    REPORT (run.json unless given) is relative to tmp_path. What a command leaves in this process is undone after
    each run, as a process of its own would have it: the modules it imported from tmp_path (a later test's script
    imports its own `helper`) and torch's anomaly mode."""
    monkeypatch.chdir(tmp_path)

    def run(*command: str, options=(), report: str = "run.json") -> tuple[Run, str, str]:
        path = tmp_path / report
        if report == "run.json" and path.exists():  # (a REPORT given is the test's: left as it is)
            path.unlink()
        anomaly = torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()
        before = set(sys.modules)
        try:
            result = CliRunner().invoke(main, ["run", "--report", report, *options, "--", *command],
                                        catch_exceptions=False)
        finally:
            torch.autograd.set_detect_anomaly(*anomaly)
            for name in set(sys.modules) - before:
                where = getattr(sys.modules[name], "__file__", None) or ""
                if where.startswith(str(tmp_path)):
                    del sys.modules[name]
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):  # none written (or REPORT names a file that is not a report: a test's)
            data = None
        return Run(result.exit_code, result.output, data), result.stdout, result.stderr

    return run


@pytest.fixture(scope="session")
def train_alone(tmp_path_factory):
    """side_by_side.TRAIN run alone (`python train.py`), once: the reference output of every test that runs that
    script unchanged."""
    folder = tmp_path_factory.mktemp("train_alone")
    (folder / "train.py").write_text(TRAIN)
    done = plain("train.py", cwd=folder)
    assert done.returncode == 0 and done.stdout.count("\n") == 3, done.stderr
    return done
