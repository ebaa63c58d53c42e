"""The script's own errors stay the script's under `debug-nan run`: an exception raised inside a torch call the
script made (its loss code, GradScaler.scale, an optimizer's constructor) shows the traceback plain Python shows,
exits as plain Python does (1), and is never called a bug of debug-nan's, wherever debug-nan's recorder or hooks sit
on the stack. A script that replaces its stderr still gets debug-nan's summary."""

import subprocess
import sys

import pytest

from tests.support.run.script_runs import alone, write

BAD_LABEL = """\
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(4):
    labels = torch.tensor([0, 1, 2, 1, 7 if step == 2 else 0])
    loss = F.cross_entropy(model(torch.randn(5, 4)), labels)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print("loss", step)
"""

SCALE_ERROR = """\
import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
scaler = torch.amp.GradScaler("cpu")
for step in range(3):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    scaled = scaler.scale(loss if step < 2 else loss.item())
    optimizer.zero_grad()
    scaled.backward()
    scaler.step(optimizer)
    scaler.update()
"""

BAD_LR = """\
import torch

model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=-1.0)
"""

REWRAPS_STDERR = """\
import io
import sys

import torch

sys.stderr = io.TextIOWrapper(sys.stderr.detach(), "utf-8")
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.full((8, 4), 0.5)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("script: done", file=sys.stderr)
"""


def _traceback(stderr: str) -> str:
    return stderr[stderr.index("Traceback (most recent call last):"):stderr.index("debug-nan: error:")]


def test_an_error_in_the_loss_code_is_the_scripts_with_its_plain_traceback(tmp_path, run_here):
    write(tmp_path, BAD_LABEL)
    done, stdout, stderr = run_here("python", "script.py")
    assert done.code == 1 and stdout == "loss 0\nloss 1\n"
    shown = _traceback(stderr)
    assert "debug_nan" not in shown and "overrides.py" not in shown  # no frame of debug-nan's, no detour to it
    assert shown.count("in cross_entropy") == 1 and 'script.py", line 9, in <module>' in shown
    assert shown.rstrip().endswith("IndexError: Target 7 is out of bounds.")
    said = " ".join(stderr.split())
    assert "debug-nan itself failed" not in said
    assert "the command raised IndexError: Target 7 is out of bounds. (at script.py:9); the watch saw no NaN/Inf " \
           "before it, so this is an error in the script" in said
    assert (done.report["status"], done.report["steps_run"], done.report["exit_code"]) == ("error", 2, 1)
    assert done.report["error"].startswith("step 3, micro-batch 1: IndexError: Target 7 is out of bounds. "
                                           "(at script.py:9)")


def test_an_error_inside_gradscaler_scale_shows_no_frame_of_debug_nan(tmp_path, run_here):
    write(tmp_path, SCALE_ERROR)
    done, _, stderr = run_here("python", "script.py")
    shown = _traceback(stderr)
    assert done.code == 1 and "debug_nan" not in shown and "debug-nan itself failed" not in stderr
    assert 'script.py", line 8, in <module>' in shown and "grad_scaler.py" in shown
    assert done.report["error"].startswith("step 3, micro-batch 1: ")


def test_a_script_raising_before_it_trains_exits_1_as_plain_python(tmp_path, run_here):
    write(tmp_path, BAD_LR)
    done, _, stderr = run_here("python", "script.py")
    said = " ".join(stderr.split())
    assert done.code == 1, said
    assert "the command raised ValueError: Invalid learning rate: -1.0 (at script.py:4) before any training " \
           "step" in said and "debug-nan itself failed" not in said
    assert (done.report["status"], done.report["exit_code"]) == ("error", 1)
    assert "debug_nan" not in _traceback(stderr)


@pytest.mark.processes
def test_a_script_that_rewraps_its_stderr_still_gets_the_summary(tmp_path):
    """In a process of its own: the script detaches the real stderr's buffer, which debug-nan's log wrote to."""
    write(tmp_path, REWRAPS_STDERR)
    done = subprocess.run([sys.executable, "-m", "debug_nan", "run", "--no-bundle", "--", "python", "script.py"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "script: done" in done.stderr
    summary = done.stderr[done.stderr.index("=== SUMMARY"):]
    assert "CLEAN: 3 step(s)" in summary


@pytest.mark.processes
def test_a_watched_processs_error_prints_pythons_own_traceback_once(tmp_path):
    """`debug-nan run -- ./train.sh`: the script's Python is watched through the start-up hook, and its error
    inside a torch call reaches Python's own excepthook, which prints the traceback the plain run prints: once (the
    summary only names the error), without the frame of the recorder the call went through."""
    write(tmp_path, BAD_LABEL)
    (tmp_path / "train.sh").write_text(f'#!/bin/sh\nexec "{sys.executable}" script.py\n')
    (tmp_path / "train.sh").chmod(0o755)
    plain = alone(tmp_path / "script.py")
    done = subprocess.run([sys.executable, "-m", "debug_nan", "run", "--no-bundle", "--", "./train.sh"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert (plain.returncode, done.returncode) == (1, 1) and done.stdout == plain.stdout == "loss 0\nloss 1\n"
    assert plain.stderr.startswith("Traceback (most recent call last):") and plain.stderr in done.stderr
    assert done.stderr.count("Traceback") == 1 and "debug_nan" not in plain.stderr
    said = " ".join(done.stderr[done.stderr.index("=== SUMMARY"):].split())
    assert "step 3, micro-batch 1: IndexError: Target 7 is out of bounds." in said
