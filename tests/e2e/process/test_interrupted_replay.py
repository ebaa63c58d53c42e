"""An interrupt during `debug-nan replay` of a NaN bundle (SIGINT to the real process) never reports clean."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

from tests.support import FAULT_TASKS

SLOW_REPLAY = FAULT_TASKS + '''

def nan_at_step_2_slow_replay():
    """NaN loss at step 2; a replay (DEBUG_NAN_TEST_SLOW set) sleeps in every loss call."""
    calls = [0]

    def loss(m, b):
        calls[0] += 1
        if os.environ.get("DEBUG_NAN_TEST_SLOW"):
            time.sleep(30)
        out = m(b).pow(2).mean()
        return out * float("nan") if calls[0] >= 2 else out
    return T(nn.Linear(3, 1), _batches(), loss)
'''


def test_an_interrupted_replay_of_a_nan_bundle_is_never_clean(tmp_path):
    (tmp_path / "faults.py").write_text(SLOW_REPLAY)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    run = subprocess.run([sys.executable, "-m", "debug_nan", "--task", "faults.py:nan_at_step_2_slow_replay",
                          "--device", "cpu", "--max-steps", "3"], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=180)
    assert run.returncode == 1, run.stdout + run.stderr
    bundle = next(tmp_path.glob("debug-nan-bundle-step2-micro1.pt"))
    proc = subprocess.Popen([sys.executable, "-m", "debug_nan", "replay", str(bundle), "--device", "cpu", "--report",
                             "r.json"], cwd=tmp_path, env=dict(env, DEBUG_NAN_TEST_SLOW="1"), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while "Replaying step" not in proc.stdout.readline() and time.monotonic() < deadline:
        pass
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    assert "CLEAN" not in out and "NONFINITE" in out and "Traceback" not in out + err
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["status"], report["interrupted"], report["exit_code"]) == ("nonfinite", True, 130)
    assert report["first_nonfinite"]["step"] == 2
    assert any("not confirmed by this replay" in note for note in report["notes"])
