"""Signals and pipes, with the real console entry point in a subprocess: SIGTERM behaves like Ctrl-C (the partial
summary and the report, exit 143), SIGINT exits 130, and a closed stdout (`| head`) ends quietly with the report
written and the real exit code."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support import FAULT_TASKS


def start(tmp_path, *args: str) -> subprocess.Popen:
    (tmp_path / "faults.py").write_text(FAULT_TASKS)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-m", "debug_nan", *args], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def wait_for_line(proc: subprocess.Popen, fragment: str, timeout: float = 120) -> list[str]:
    lines, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if fragment in line:
            return lines
    proc.kill()
    raise AssertionError(f"never saw {fragment!r}: {''.join(lines)}")


@pytest.mark.parametrize("signum, code, name", [(signal.SIGTERM, 143, "SIGTERM"), (signal.SIGINT, 130, "Ctrl-C")])
def test_signal_mid_run_writes_the_partial_summary_and_report(tmp_path, signum, code, name):
    proc = start(tmp_path, "--task", "faults.py:slow", "--device", "cpu", "--max-steps", "500",
                 "--report", "r.json")
    wait_for_line(proc, "STEP 3/500")
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, out + err
    assert f"Interrupted ({name})" in out and f"({name}, exit {code})" in out and "SUMMARY" in out
    assert "Traceback" not in out + err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["interrupted"] is True and report["exit_code"] == code and report["status"] == "clean"
    assert 2 <= report["steps_run"] < 500


def test_closed_stdout_ends_quietly_with_the_report_and_the_real_code(tmp_path):
    """`debug-nan ... | head -3`: the reader goes away; the run finishes, the report says what it found."""
    proc = start(tmp_path, "--task", "faults.py:nan_at_step_2", "--device", "cpu", "--max-steps", "3",
                 "--report", "r.json", "--log", "copy.log")
    for _ in range(3):
        proc.stdout.readline()
    proc.stdout.close()  # what `head` does after its lines
    err = proc.stderr.read()
    proc.wait(timeout=120)
    assert proc.returncode == 1, err
    assert "Traceback" not in err and "BrokenPipe" not in err
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "nonfinite" and report["exit_code"] == 1
    assert any("stdout was closed" in note for note in report["notes"])
    assert "SUMMARY" in (tmp_path / "copy.log").read_text()  # the copy still has everything
