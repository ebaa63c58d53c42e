"""The SSH session and its streams, with the real console entry point in subprocesses (process/streams.py).

SIGHUP: the run goes on as under nohup (the report, --log and bundle are what matters), on a pty that hangs up
(the master closed, SIGHUP to the job's process group as the login shell sends it), alone or in `2>&1 | tee`.
Broken or full streams: `| tee` whose reader is gone, stdout on /dev/full, a closed stdout (`>&-`) or stderr
(`2>&-`): the exit code the run earned, the report and the --log copy, never a traceback. One row per case.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import select
import shlex
import signal
import subprocess
import sys
import termios
import time
from dataclasses import dataclass

import pytest

from tests.support import FAULT_TASKS
from tests.support.signals import handles

TASKS = FAULT_TASKS + '''

def _waits_at_step_5(nan_from):
    """Step 5 waits until the file `hung-up` exists (the test writes it after the hang-up); NaN loss from step
    `nan_from` on."""
    calls = [0]

    def loss(m, b):
        calls[0] += 1
        deadline = time.monotonic() + 60
        while calls[0] == 5 and not os.path.exists("hung-up") and time.monotonic() < deadline:
            time.sleep(0.05)
        out = m(b).pow(2).mean()
        return out * float("nan") if calls[0] >= nan_from else out
    return T(nn.Linear(3, 1), _batches(), loss)


def waits_for_hang_up():
    return _waits_at_step_5(10**9)


def waits_for_hang_up_then_nan():
    return _waits_at_step_5(8)
'''

DEBUG_NAN = f"{shlex.quote(sys.executable)} -m debug_nan"


def _folder(tmp_path):
    (tmp_path / "faults.py").write_text(TASKS)
    return dict(os.environ, PYTHONUNBUFFERED="1", NO_COLOR="1")


def _report(tmp_path, name="r.json") -> dict:
    return json.loads((tmp_path / name).read_text())


@dataclass
class Stream:
    id: str
    redirect: str  # what follows the command in `bash -c`
    task: str
    args: str
    code: int
    note: str  # in the report's notes (or its error for exit 2)


STREAMS = [
    Stream("stdout-on-dev-full", "> /dev/full", "healthy", "--max-steps 2", 0, "No space left on device"),
    Stream("closed-stdout-finding", ">&-", "nan_at_step_2", "--max-steps 3", 1, "stdout was closed or failed"),
    Stream("closed-stderr-finding", "2>&-", "nan_at_step_2", "--max-steps 3", 1, ""),
    Stream("closed-stderr-bad-input", "2>&-", "healthy", "--max-steps 0", 2, "--max-steps must be a positive"),
    Stream("tee-reader-gone-bad-input", "2>&1 | (exec 0<&-; sleep 1)", "healthy", "--max-steps 0", 2,
           "--max-steps must be a positive"),
    Stream("tee-reader-gone-finding", "2>&1 | (exec 0<&-; sleep 1)", "nan_at_step_2", "--max-steps 3", 1,
           "Broken pipe"),
    Stream("both-on-dev-full-finding", "> /dev/full 2>&1", "nan_at_step_2", "--max-steps 3", 1,
           "No space left on device"),
]


@pytest.mark.parametrize("case", STREAMS, ids=lambda c: c.id)
def test_a_broken_or_full_stream_keeps_the_exit_code_the_report_and_the_log(tmp_path, case):
    env = _folder(tmp_path)
    command = (f"{DEBUG_NAN} --task faults.py:{case.task} --device cpu {case.args} --report r.json --log copy.log "
               f"{case.redirect}; echo \"exit ${{PIPESTATUS[0]}}\" > code.txt")
    proc = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180)
    code = int((tmp_path / "code.txt").read_text().split()[1])
    assert code == case.code, proc.stdout + proc.stderr
    report = _report(tmp_path)
    assert report["exit_code"] == case.code
    said = report.get("error", "") if case.code == 2 else " ".join(report["notes"])
    assert case.note in said, said
    log = (tmp_path / "copy.log").read_text() if case.code != 2 else ""  # bad settings: no log opened
    assert "Traceback" not in proc.stdout + proc.stderr + log
    assert "SUMMARY" in log or case.code == 2


def _on_a_pty(tmp_path, env, command: str, until: str) -> tuple[subprocess.Popen, str]:
    """`bash -c command` as the session leader of a new pty (its controlling terminal); read its output until
    `until`, then hang up: the master closes (what sshd does when the connection drops) and the job's process
    group gets SIGHUP (what the login shell then sends its jobs)."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(["bash", "-c", command], stdin=slave, stdout=slave, stderr=slave, cwd=tmp_path, env=env,
                            start_new_session=True, preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
    os.close(slave)
    seen, deadline = b"", time.monotonic() + 120
    while until.encode() not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                seen += os.read(master, 4096)
            except OSError:
                break
    os.close(master)
    try:
        os.killpg(proc.pid, signal.SIGHUP)
    except ProcessLookupError:
        pass
    assert until.encode() in seen, seen.decode(errors="replace")
    return proc, seen.decode(errors="replace")


def _wait_for_the_group(proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until every process of the job (bash, tee, debug-nan) is gone; bash is reaped here (zombies count)."""
    pgid, deadline = proc.pid, time.monotonic() + timeout
    while time.monotonic() < deadline:
        proc.poll()
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    os.killpg(pgid, signal.SIGKILL)
    raise AssertionError("the job was still running")


@pytest.mark.parametrize("pipeline, task, steps, code, status", [  # (each task and each pipeline once)
    ("", "waits_for_hang_up", 12, 0, "clean"),
    ("2>&1 | tee out.txt", "waits_for_hang_up_then_nan", 12, 1, "nonfinite")], ids=["alone-clean", "tee-nonfinite"])
def test_a_hang_up_lets_the_run_finish_as_nohup_would(tmp_path, pipeline, task, steps, code, status):
    env = _folder(tmp_path)
    command = (f"{DEBUG_NAN} --task faults.py:{task} --device cpu --max-steps {steps} --report r.json "
               f"--log copy.log {pipeline}")
    proc, seen = _on_a_pty(tmp_path, env, command, "STEP 4/")
    (tmp_path / "hung-up").write_text("")
    if pipeline:  # bash and tee die of the hang-up; debug-nan goes on alone
        _wait_for_the_group(proc)
    else:
        assert proc.wait(timeout=120) == code
    report = _report(tmp_path)
    assert (report["exit_code"], report["status"], report["interrupted"]) == (code, status, False), report
    assert any("hung up (SIGHUP)" in note for note in report["notes"]), report["notes"]
    if code == 0:
        assert report["steps_run"] == steps
    log = (tmp_path / "copy.log").read_text()
    assert "SUMMARY" in log and "Traceback" not in log and f"STEP {steps if code == 0 else 2}/{steps}" in log


@pytest.mark.parametrize("signals, when, code, steps", [
    ((signal.SIGTERM,), "start", 143, 0),  # torch still importing: before the log opens
    ((signal.SIGINT,), "start", 130, 0),
    ((signal.SIGINT, signal.SIGINT), "STEP 3/", 130, None),  # a second Ctrl-C while the first is handled
    ((signal.SIGTERM, signal.SIGTERM), "STEP 3/", 143, None),
], ids=["sigterm-before-the-log", "ctrl-c-before-the-log", "ctrl-c-twice", "sigterm-twice"])
def test_an_interrupt_at_any_time_leaves_the_report_and_no_traceback(tmp_path, signals, when, code, steps):
    env = _folder(tmp_path)
    proc = subprocess.Popen([sys.executable, "-m", "debug_nan", "--task", "faults.py:slow", "--device", "cpu",
                             "--max-steps", "500", "--report", "r.json"], cwd=tmp_path, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    if when == "start":
        while not handles(proc.pid, signal.SIGTERM) and time.monotonic() < deadline:
            time.sleep(0.002)
    else:
        while when not in proc.stdout.readline() and time.monotonic() < deadline:
            pass
    for k, signum in enumerate(signals):
        time.sleep(0.1 if k else 0)  # the second while the first is handled, or while the process ends
        proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, out + err
    assert "Traceback" not in out + err and "Exception ignored" not in err, err
    report = _report(tmp_path)
    assert (report["exit_code"], report["interrupted"], report["status"]) == (code, True, "clean")
    assert report["steps_run"] == steps if steps is not None else 2 <= report["steps_run"] < 500
