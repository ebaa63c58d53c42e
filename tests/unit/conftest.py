"""Fixtures the unit tests of several components share."""

import pytest

from debug_nan.drivers.run.recorder import Recorder


@pytest.fixture
def recorder():
    """The tape's TorchFunctionMode on torch's stack for one test."""
    r = Recorder()
    r.install()
    yield r
    r.uninstall()
