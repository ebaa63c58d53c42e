"""What both layers share: the isolation every test runs in, the tiny synthetic data set, the paths of the
repository, and the console entry point in a fresh process. The layers: tests/unit (fast, in this process: `pytest
tests/unit`, or `-m "not e2e"`) and tests/e2e (whole jobs through an entry point, marked `e2e` by its conftest);
what both import lives in tests/support."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from debug_nan.aam.data.synthetic import synthesize
from tests.support import REPO, SUPPORT

TINY = str(REPO / "configs" / "tiny.toml")
SCENARIOS = SUPPORT / "scenarios.py"
UNIT = Path(__file__).resolve().parent / "unit"


def pytest_configure(config):
    """The bundle key of the whole session (every xdist worker and every process a test starts) in a temporary
    config folder, never the user's: set in the controller before its workers start, so that they inherit it and
    a bundle written by one replays in another."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        config.debug_nan_config = tempfile.mkdtemp(prefix="debug-nan-test-config-")
        os.environ["XDG_CONFIG_HOME"] = config.debug_nan_config
        os.environ.pop("DEBUG_NAN_BUNDLE_KEY", None)


# The longest tests first, so that pytest-xdist's workers end together: the GPU check's CPU quick run (minutes of
# one worker), then the tests whose processes are their subject (torchrun's ranks, signals, the scripts), then the
# rest of the end-to-end layer; the unit layer's short tests fill the end. Stable: within each group, collection
# order. scripts/test.sh hands the workers whole files (`--dist loadfile`), one at a time as each ends one, so that
# the run a file's tests share (tests/support/once.py) is made and read on one worker, never waited for by the other.
LONGEST_FIRST = (("tests", "e2e", "scripts", "test_gpu_check.py"), ("tests", "e2e", "ddp"), ("tests", "e2e", "process"),
                 ("tests", "e2e", "scripts"), ("tests", "e2e"))


def _weight(item) -> int:
    parts = item.path.relative_to(UNIT.parent.parent).parts
    return next((k for k, head in enumerate(LONGEST_FIRST) if parts[:len(head)] == head), len(LONGEST_FIRST))


def pytest_collection_modifyitems(items):
    """tests/unit: the unit layer (tests/e2e/conftest.py marks its own); the longest tests first."""
    for item in items:
        if UNIT in item.path.parents:
            item.add_marker(pytest.mark.unit)
    items.sort(key=_weight)


def pytest_unconfigure(config):
    if getattr(config, "debug_nan_config", None):
        shutil.rmtree(config.debug_nan_config, ignore_errors=True)


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("DEBUG_NAN_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))
    # log lines unwrapped, so that tests find messages that name long temporary paths on one line; the tests of
    # the 100-column log (tests/unit/presentation/test_log_width.py) set the width back
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


def run_process(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    """The real console entry point in a fresh process."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.run([sys.executable, "-m", "debug_nan", *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)
