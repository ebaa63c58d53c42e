"""The log fits the screen: fit() wraps under the text, the width can be set or turned off, and a tensor of zeros
has no headroom. (A real run's lines within 100 columns, --quiet, --version, --help:
tests/e2e/cli/test_log_width.py.)"""

import pytest

from debug_nan.presentation.line_width import fit


@pytest.fixture(autouse=True)
def _default_width(monkeypatch):
    monkeypatch.delenv("DEBUG_NAN_LOG_WIDTH", raising=False)  # conftest turns wrapping off for the other tests


def test_fit_wraps_under_the_text():
    line = "  [pinpoint] " + "word " * 30
    parts = fit(line)
    assert len(parts) == 2 and all(len(p) <= 100 for p in parts)
    assert parts[1].startswith(" " * 13 + "word")  # under the text after the tag
    summary = fit("  status       CLEAN: " + "x " * 50)
    assert summary[1].startswith(" " * 15 + "x")  # under the summary's value column
    assert fit("a" * 250) == ["a" * 100, "  " + "a" * 98, "  " + "a" * 52]
    assert fit("short") == ["short"]


def test_the_width_can_be_set_or_turned_off(monkeypatch, capsys):
    from debug_nan.presentation.log import Log

    monkeypatch.setenv("DEBUG_NAN_LOG_WIDTH", "0")
    Log()("x " * 80)
    monkeypatch.setenv("DEBUG_NAN_LOG_WIDTH", "60")
    Log()("y " * 40)
    lines = capsys.readouterr().out.splitlines()
    assert [len(line) for line in lines] == [160, 59, 21]


def test_an_all_zero_tensor_has_no_headroom():
    import torch

    from debug_nan.engine.stats import tensor_stats

    line = tensor_stats(torch.zeros(3)).line()
    assert "headroom" not in line and "inf" not in line.lower().replace("+inf 0", "").replace("-inf 0", "")
    assert "headroom 3.4e+38x" in tensor_stats(torch.ones(2)).line()


def test_a_float64_tensor_under_one_has_its_headroom_said_as_a_bound():
    """float64's max over a |x| below 1 is more than a float holds: not `headroom infx` (the headroom is finite)."""
    import torch

    from debug_nan.engine.stats import tensor_stats

    line = tensor_stats(torch.tensor([0.5, -0.25], dtype=torch.float64)).line()
    assert "headroom >1e308x" in line and "infx" not in line
    assert "headroom 1.8e+308x" in tensor_stats(torch.tensor([1.0], dtype=torch.float64)).line()
