"""The end-to-end layer: every test here runs a whole job through an entry point (the CLI's --task or built-in
task, `debug-nan run`, a framework's trainer, torchrun, a script of scripts/), in this process or a fresh one.
Each is marked `e2e` here, from its folder: `pytest -m "not e2e"` and `pytest tests/unit` are the same unit layer.
Two layers within it: in this process (`-m "e2e and not processes"`: `run_here`, `run_cli`, the callbacks; a
comparison with the plain run starts the script alone with the real interpreter, its reference), and in processes
of its own (`-m processes`: every test of ddp/, process/ and scripts/, and those elsewhere marked `processes`),
where the process is what is tested: its exit code, signals, hang-ups, torchrun and launchers, a fresh
interpreter's imports, setup. A test of the first layer that starts debug-nan or a launcher as a process fails.

    cli/         `debug-nan ...` and `debug-nan replay`: tasks, data, checkpoints, bundles, outputs, exit codes
    run/         `debug-nan run -- COMMAND`: user-like scripts alone and watched
    frameworks/  the Lightning and HF Trainer callbacks, and the same bugs through every entry point (parity)
    ddp/         several processes: torchrun, gloo, mp.spawn
    process/     the console entry point as a process: signals, hang-ups, closed streams
    scripts/     the scripts of scripts/ (benchmarks, the GPU check, setup.sh, the remote script)
"""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from debug_nan.app.cli import main

HERE = Path(__file__).resolve().parent
PROCESS_FOLDERS = ("ddp", "process", "scripts")  # every test there starts processes: they are its subject
# what only a test marked `processes` starts: debug-nan or a launcher of ranks as a process of its own
ENTRY_WORDS = ("debug_nan", "torch.distributed.run", "torchrun", "accelerate.commands.launch")


def pytest_collection_modifyitems(items):
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.e2e)
            if item.path.relative_to(HERE).parts[0] in PROCESS_FOLDERS:
                item.add_marker(pytest.mark.processes)


@pytest.fixture(autouse=True)
def _in_process_layer(request, monkeypatch):
    """A test not marked `processes` runs its entry point in this process: starting one as a process fails it."""
    if request.node.get_closest_marker("processes"):
        return
    start = subprocess.Popen.__init__

    def guarded(self, args, *rest, **kwargs):
        words = [str(a) for a in args] if isinstance(args, (list, tuple)) else str(args).split()
        if words and words[0] == sys.executable and any(w in ENTRY_WORDS for w in words[1:3]):
            raise AssertionError(f"{request.node.nodeid} starts {' '.join(words[:4])} as a process: run it in "
                                 "this process (run_here, run_cli), or mark the test `processes` if the process "
                                 "is what it tests")
        start(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", guarded)



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
