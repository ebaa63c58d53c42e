"""debug_nan.frames: which frame is the user's, read from the package layout, and the exception described at the
user's own line."""

import os
import traceback

import torch

from debug_nan.errors import describe_exception
from debug_nan.frames import PACKAGE_DIR, TORCH_DIR, frame_kind, pick_frame, short_path


def test_frame_kinds_from_the_package_layout():
    assert frame_kind(os.path.join(PACKAGE_DIR, "engine", "trace", "tracer.py")) == "tool"
    assert frame_kind(os.path.join(PACKAGE_DIR, "drivers", "trainer", "loop.py")) == "tool"
    assert frame_kind(os.path.join(PACKAGE_DIR, "aam", "model", "attention.py")) == "user"
    assert frame_kind(os.path.join(PACKAGE_DIR, "aam", "data", "batches.py")) == "user"
    assert frame_kind(os.path.join(PACKAGE_DIR, "aam", "task.py")) == "user"
    assert frame_kind(os.path.join(TORCH_DIR, "optim", "adam.py")) == "torch"
    assert frame_kind(os.path.join(TORCH_DIR, "utils", "_python_dispatch.py")) == "plumbing"
    assert frame_kind(__file__) == "user"


def test_describe_exception_names_the_user_frame():
    def users_code():
        return torch.zeros(2) @ torch.zeros(3)  # raises inside torch

    try:
        users_code()
    except RuntimeError as exc:
        line = traceback.extract_tb(exc.__traceback__)[-1].lineno
        assert describe_exception(exc).endswith(f"(at {short_path(__file__)}:{line})")


def test_the_frame_shown_is_never_the_one_that_called_debug_nan():
    """Innermost first. The tracer's frames on top are skipped; a replay's driver frame below them ends the search
    (torch 2.4 calls the tracer with no torch frame in between), so click or the script that started debug-nan is
    never taken for the op's line; user code the replay calls (a model's forward) still is."""
    tracer = os.path.join(PACKAGE_DIR, "engine", "trace", "tracer.py")
    tape = os.path.join(PACKAGE_DIR, "drivers", "run", "tape.py")
    plumbing = os.path.join(TORCH_DIR, "utils", "_python_dispatch.py")
    caller, forward = "/site-packages/click/core.py", "/home/me/model.py"
    assert pick_frame([tracer, tracer, tape, caller]) is None
    assert pick_frame([tracer, plumbing, tape, caller]) is None
    assert pick_frame([tracer, plumbing, forward, tape, caller]) == 2


def test_an_error_of_a_torch_call_the_recorder_passed_on_is_the_callers():
    """The recorder of `debug-nan run` sits on the stack of every torch call the script makes: an error of that
    call is the script's (None), one of debug-nan's own code names debug-nan's frame."""
    from debug_nan.drivers.run.recorder import Recorder
    from debug_nan.drivers.run.tape import Tape
    from debug_nan.frames import raising_tool_frame

    recorder = Recorder()
    recorder.install()
    recorder.tape = Tape()  # (a micro-batch's tape open: the recorder on the stack, as between forward and backward)
    try:
        torch.nn.functional.cross_entropy(torch.zeros(2, 3), torch.tensor([0, 7]))
    except IndexError as exc:
        script_error = exc
    finally:
        recorder.tape = None
        recorder.uninstall()
    files = [f.filename for f in traceback.extract_tb(script_error.__traceback__)]
    assert any(f.endswith(os.path.join("drivers", "run", "recorder.py")) for f in files)  # it was on the stack
    assert raising_tool_frame(script_error) is None
    try:
        short_path(None)  # debug-nan's own code given a bad value: raises in its own frame
    except AttributeError as exc:
        filename, _ = raising_tool_frame(exc)
        assert filename == os.path.join(PACKAGE_DIR, "frames.py")


def test_installed_code_is_told_by_where_it_lives():
    """site-packages / dist-packages of any environment, the interpreter's standard library and torch are installed;
    the user's files, anywhere else, and the built-in pipeline are not."""
    from debug_nan.frames import is_installed

    assert is_installed("/opt/env/lib/python3.11/site-packages/timm/layers/norm.py")
    assert is_installed("/usr/lib/python3/dist-packages/transformers/models/gpt2/modeling_gpt2.py")
    assert is_installed(os.path.join(os.path.dirname(os.__file__), "contextlib.py"))
    assert is_installed(os.path.join(TORCH_DIR, "nn", "functional.py"))
    assert not is_installed("/home/me/nanoGPT/model.py") and not is_installed(__file__)
    assert not is_installed(os.path.join(PACKAGE_DIR, "aam", "model", "attention.py"))


def test_the_users_own_line_is_shown_and_the_librarys_line_beside_it():
    """Innermost first: the op ran in torch.nn.functional, called by timm's norm, called by the user's model; the
    source is the user's line, the line beside it the library's outside torch (else torch's own)."""
    from debug_nan.frames import pick_frames

    plumbing = os.path.join(TORCH_DIR, "utils", "_python_dispatch.py")
    functional = os.path.join(TORCH_DIR, "nn", "functional.py")
    module = os.path.join(TORCH_DIR, "nn", "modules", "module.py")
    timm = "/opt/env/lib/python3.11/site-packages/timm/layers/norm.py"
    user = "/home/me/train.py"
    assert pick_frames([plumbing, functional, timm, module, user]) == (4, 2, True)
    assert pick_frames([plumbing, functional, module, user]) == (3, 1, True)
    assert pick_frames([user, functional]) == (0, None, True)  # the user's own code called the op
    # no frame of the user's own: the library's line is shown alone (the caller decides, e.g. a replayed call's)
    assert pick_frames([functional, timm, os.path.join(PACKAGE_DIR, "drivers", "run", "tape.py"), user]) == (
        1, None, False)


def test_a_message_of_several_lines_is_cut_to_its_first_only_when_asked():
    """torch.load's weights-only error runs to eight lines: the line under the script's traceback keeps the first."""
    try:
        raise ValueError("Weights only load failed.\n\t(1) re-run with weights_only=False\n\t(2) allowlist it\n")
    except ValueError as exc:
        short, full = describe_exception(exc, first_line=True), describe_exception(exc)
    assert short.startswith("ValueError: Weights only load failed. [+2 lines, in the traceback above] (at ")
    assert "(2) allowlist it" in full and "[+" not in full
