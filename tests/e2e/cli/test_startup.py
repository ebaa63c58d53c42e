"""What the CLI imports before torch: debug_nan.errors and debug_nan.frames load without it (a fresh process)."""

import os
import subprocess
import sys

import pytest

from debug_nan.frames import TORCH_DIR

pytestmark = pytest.mark.processes  # a fresh interpreter's imports are the subject


def test_errors_and_frames_load_without_torch():
    """The CLI imports errors.py to answer --help before torch loads; the frame rule must not pull torch in."""
    code = "import sys, debug_nan.errors, debug_nan.frames as f; assert 'torch' not in sys.modules; print(f.TORCH_DIR)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == TORCH_DIR and os.path.isfile(os.path.join(out, "__init__.py"))
