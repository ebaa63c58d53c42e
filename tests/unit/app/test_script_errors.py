"""Whose error it is, and its traceback as `python script.py` shows it (app/script_errors.py): the script's error
raised inside a torch call that went through `debug-nan run`'s recorder keeps the script's frames and torch's, not
debug-nan's (in a process the start-up hook watches, the excepthook is handed that traceback)."""

import pytest
import torch

from debug_nan.app import script_errors
from debug_nan.drivers.run.tape import Tape


def _scripts_loss(x):
    return torch.mm(x, torch.ones(4, 5))  # (3x2 @ 4x5: torch raises)


def _raised_through_the_recorder(recorder) -> RuntimeError:
    recorder.tape = Tape()
    try:
        _scripts_loss(torch.ones(3, 2))
    except RuntimeError as exc:
        return exc
    finally:
        recorder.tape = None
    raise AssertionError("torch.mm did not raise")


def names(tb) -> list[str]:
    out = []
    while tb is not None:
        out.append(tb.tb_frame.f_code.co_name)
        tb = tb.tb_next
    return out


def test_the_recorders_frame_is_not_in_the_traceback_python_is_handed(recorder):
    exc = _raised_through_the_recorder(recorder)
    assert "__torch_function__" in names(exc.__traceback__)  # (the recorder was on the way)
    shown = script_errors.as_python_shows(exc)
    assert names(shown) == ["_raised_through_the_recorder", "_scripts_loss"]
    assert exc.__traceback__ is shown and shown.tb_next.tb_lineno == _scripts_loss.__code__.co_firstlineno + 1


def test_debug_nans_own_error_keeps_every_frame():
    with pytest.raises(AttributeError) as raised:
        Tape().returned(None, None)  # (debug-nan's own code raising: a bug report needs its frames)
    every = names(raised.value.__traceback__)
    assert names(script_errors.as_python_shows(raised.value)) == every and "returned" in every
