"""The recorder (drivers/run/recorder.py) is on torch's function-mode stack only while a tape is open, and goes on
below the script's own modes."""

import torch
from torch.overrides import TorchFunctionMode

from debug_nan.drivers.run import functions
from debug_nan.drivers.run.tape import Tape


def stack() -> list:
    return [torch._C._get_function_stack_at(i) for i in range(torch._C._len_torch_function_stack())]


class Doubling(TorchFunctionMode):
    """A script's own mode: every torch.add it sees adds twice."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        return func(out, args[1]) if func is torch.add else out


def test_off_the_stack_with_no_tape_open_and_on_it_while_one_is(recorder):
    assert recorder not in stack()  # (installed, no tape: zero_grad and the data pay no dispatch)
    tape = recorder.tape = Tape()
    assert stack() == [recorder]
    torch.add(torch.ones(2), 1)
    recorder.suspend()  # (the model's forward)
    assert stack() == []
    recorder.resume()
    assert stack() == [recorder]
    recorder.tape = None
    assert stack() == [] and [e.func for e in tape.entries] == [torch.ones, torch.add]


def test_a_tape_opened_inside_a_mode_of_the_script_leaves_that_mode_on_top(recorder):
    with Doubling() as mode:
        tape = recorder.tape = Tape()
        assert stack() == [recorder, mode]
        out = torch.add(torch.zeros(2), 1)
    assert stack() == [recorder]  # (the mode's exit popped the mode, not the recorder)
    assert [e.func for e in tape.entries] == [torch.zeros, torch.add, torch.add]
    recorder.tape = None
    assert stack() == [] and out.tolist() == [2.0, 2.0]


def test_custom_functions_stay_wrapped_while_no_tape_is_open_and_unwrapped_inside_the_model(recorder):
    """A script looks `MyFunction.apply` up before the model call that opens the tape (`F.apply(model(x))`)."""
    assert torch.autograd.Function.__dict__["apply"] is not functions._ORIGINAL and recorder not in stack()
    recorder.suspend()  # (the model's forward: torch.compile traces the original apply there)
    assert torch.autograd.Function.__dict__["apply"] is functions._ORIGINAL
    recorder.resume()
    assert torch.autograd.Function.__dict__["apply"] is not functions._ORIGINAL
