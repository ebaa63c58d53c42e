import json

import pytest
from click.testing import CliRunner

from debug_nan.app.cli import main
from tests.e2e.conftest import Run


@pytest.fixture
def run_here(tmp_path, monkeypatch):
    """`debug-nan run --report R OPTIONS -- COMMAND` in this process, in tmp_path -> (Run, stdout, stderr)."""
    monkeypatch.chdir(tmp_path)

    def run(*command: str, options=()) -> tuple[Run, str, str]:
        report = tmp_path / "run.json"
        if report.exists():
            report.unlink()
        result = CliRunner().invoke(main, ["run", "--report", str(report), *options, "--", *command],
                                    catch_exceptions=False)
        data = json.loads(report.read_text()) if report.exists() else None
        return Run(result.exit_code, result.output, data), result.stdout, result.stderr

    return run
