"""One script run twice in fresh processes: plain `python SCRIPT` and `python -m debug_nan run -- python SCRIPT`,
from the same folder, so that a test compares their stdout and exit codes (tests/e2e/run/test_run_*.py)."""

import json
import os
import subprocess
import sys
from pathlib import Path

TRAIN = """import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(3):
    loss = model(torch.randn(8, 3)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}", flush=True)
"""  # a healthy few steps: the body of the small scripts of these tests


def env() -> dict:
    return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")


def plain(*words: str, cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    """`python WORDS...` (words as typed after `python`)."""
    return subprocess.run([sys.executable, *words], cwd=cwd, env=env(), capture_output=True, text=True,
                          timeout=timeout)


def watched(*words: str, cwd: Path, options=(), report: str = "run.json",
            timeout: int = 300) -> tuple[subprocess.CompletedProcess, dict | None]:
    """`python -m debug_nan run --report REPORT OPTIONS -- python WORDS...` (REPORT as given: relative to cwd)
    -> (the process, the report, None when none was written).
    A test runs it in a fresh folder (an existing REPORT file stays, for the tests about output paths)."""
    path = cwd / report
    done = subprocess.run([sys.executable, "-m", "debug_nan", "run", "--report", report, *options, "--", "python",
                           *words], cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)
    try:
        return done, json.loads(path.read_text())
    except (OSError, ValueError):  # none written (or REPORT names a file that is not a report: a test's)
        return done, None
