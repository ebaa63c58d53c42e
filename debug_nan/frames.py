"""Which stack frame is the user's: one rule for source lines (the tracer) and error messages (errors.py).

A frame is one of
  * "tool": debug_nan's own machinery (checks, the training driver, the runner, the CLI, the API);
  * "user": anything outside torch and the tool, plus the built-in pipeline's own model, data and task code
    (debug_nan/aam/: its model, data and task), which play the user's part for it;
  * "torch": a torch library frame worth showing when no user frame exists (torch/optim/adam.py);
  * "plumbing": torch's wrappers and dispatch, never the line to show.
The layout is read from the installed package's directory, so it holds wherever debug_nan is installed.

A "user" or "torch" frame may also be INSTALLED (is_installed): a file of an installed package (site-packages,
dist-packages, the interpreter's sysconfig paths), of the standard library, or of torch. The line shown for an op
(pick_frames) is the innermost user frame that is not installed, the user's own code; where the op itself ran
inside an installed library (torch.nn, timm, transformers), that library's innermost line is shown beside it
(`inside`).
"""

from __future__ import annotations

import importlib.util
import linecache
import os
import site
import sys
import sysconfig
import traceback
from contextlib import contextmanager

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
PACKAGE_PARENT = os.path.dirname(PACKAGE_DIR)
# located without importing torch: errors.py uses this module, and the CLI answers --help before torch loads
_TORCH_SPEC = importlib.util.find_spec("torch")
TORCH_DIR = (os.path.dirname(os.path.abspath(_TORCH_SPEC.origin)) if _TORCH_SPEC and _TORCH_SPEC.origin
             else "<no torch>")
# the built-in pipeline's "user code": what a --task file holds for a user's own model
BUILTIN_USER_CODE = (os.path.join(PACKAGE_DIR, "aam", ""),)
TRACER_CODE = os.path.join(PACKAGE_DIR, "engine", "trace", "")  # the frames on top when the tracer asks
TORCH_PLUMBING = tuple(os.path.join(TORCH_DIR, sub) for sub in ("_dynamo", "utils", "_ops.py", "_tensor.py",
                                                                  "overrides.py", "autograd", "_compile.py"))


def _install_roots() -> tuple[str, ...]:
    """The folders installed code lives in: the interpreter's sysconfig paths (the standard library, purelib,
    platlib), site's package folders (the base interpreter's too: a virtual environment may chain to them)."""
    roots = set()
    for scheme_paths in (sysconfig.get_paths(), sysconfig.get_paths(vars={"base": sys.base_prefix,
                                                                             "platbase": sys.base_exec_prefix})):
        roots |= {scheme_paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    try:
        roots |= set(site.getsitepackages()) | {site.getusersitepackages()}
    except AttributeError:  # (an embedded interpreter's reduced `site`)
        pass
    return tuple(sorted(os.path.join(os.path.abspath(r), "") for r in roots if r))


INSTALL_ROOTS = _install_roots()
# a package folder of any environment (a virtual environment chained to another one's site-packages by a .pth)
INSTALLED_SEGMENTS = (f"{os.sep}site-packages{os.sep}", f"{os.sep}dist-packages{os.sep}")


def is_installed(filename: str) -> bool:
    """Is the file installed code (a package, the standard library, torch), not the user's own? Judged by where
    it lives, never by a list of names. debug_nan's built-in pipeline (aam/) plays the user's part wherever it is
    installed."""
    if filename.startswith(BUILTIN_USER_CODE):
        return False
    if filename.startswith((TORCH_DIR + os.sep, "<frozen")) or any(s in filename for s in INSTALLED_SEGMENTS):
        return True
    return filename.startswith(INSTALL_ROOTS)


# FSDP's own code: it re-allocates its all-gather buffers by resizing their storage (garbage until written)
FSDP_CODE = os.path.join(TORCH_DIR, "distributed", "fsdp", "")
# torch's collectives (all_gather, reduce_scatter_tensor, ...): ops run there carry out a collective (gloo reduces
# a copy of the input, then splits it), not the script's computation
C10D_CODE = os.path.join(TORCH_DIR, "distributed", "distributed_c10d.py")


def called_from(prefix: str) -> bool:
    """Whether the code that made the running torch call (the innermost frame that is neither debug-nan's nor
    torch's dispatch plumbing) lives under `prefix`."""
    frame = sys._getframe(1)
    while frame is not None and frame_kind(frame.f_code.co_filename) in ("tool", "plumbing"):
        frame = frame.f_back
    return frame is not None and frame.f_code.co_filename.startswith(prefix)


def frame_kind(filename: str) -> str:
    """"tool" | "user" | "torch" | "plumbing" for a frame's file name (see the module docstring)."""
    if filename.startswith(PACKAGE_DIR + os.sep):
        return "user" if filename.startswith(BUILTIN_USER_CODE) else "tool"
    if filename.startswith(TORCH_DIR + os.sep):
        return "plumbing" if filename.startswith(TORCH_PLUMBING) else "torch"
    return "user"


def short_path(path: str) -> str:
    """debug_nan/... for the tool's own files, torch/... for installed libraries, a path relative to the
    working directory when inside it, else the last two components."""
    if path.startswith(PACKAGE_PARENT + os.sep) and "site-packages" not in os.path.relpath(path, PACKAGE_PARENT):
        return os.path.relpath(path, PACKAGE_PARENT)
    if "site-packages" + os.sep in path:
        return path.split("site-packages" + os.sep, 1)[1]
    try:
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            return rel
    except ValueError:  # another drive (Windows)
        pass
    return os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))


def pick_frames(files_innermost_first) -> tuple[int | None, int | None, bool]:
    """(index of the frame to show, index of the library frame beside it or None, whether the first is the user's
    own) among file names given innermost first. The frame shown is the innermost user frame that is not
    installed (is_installed); the one beside it, the innermost installed frame inside it (a library outside torch
    first: timm's norm.py over the torch.nn.functional line it calls; else torch's innermost line). With no user
    frame of its own, the innermost installed frame is shown (torch/optim/adam.py), alone. The tracer's own frames
    on top of the stack are skipped; any other tool frame is the driver that called the op (a replay calling
    recorded code: on some torch versions with no torch frame in between), and the search ends there, never
    reaching whoever called debug-nan."""
    library = in_torch = None
    outside = False
    for i, filename in enumerate(files_innermost_first):
        kind = frame_kind(filename)
        if kind == "tool":
            if outside or not filename.startswith(TRACER_CODE):
                break
            continue
        outside = True
        if kind == "plumbing":
            continue
        if kind == "user" and not is_installed(filename):
            return i, library if library is not None else in_torch, True
        if kind == "user" and library is None:
            library = i
        elif kind == "torch" and in_torch is None:
            in_torch = i
    return (library if library is not None else in_torch), None, False


def pick_frame(files_innermost_first) -> int | None:
    """Index of the frame to show (pick_frames), else None."""
    return pick_frames(files_innermost_first)[0]


_replayed_at: tuple[str, int] | None = None  # see replayed_at


@contextmanager
def replayed_at(location: tuple[str, int] | None):
    """While a replay calls again a call the user's code made in the run (drivers/run/tape.py), (filename, lineno) of
    that call stands for the user frame the replay's stack does not have."""
    global _replayed_at
    before, _replayed_at = _replayed_at, location
    try:
        yield
    finally:
        _replayed_at = before


def replayed_source() -> str | None:
    """"file.py:57" of the call being replayed (replayed_at), else None."""
    return None if _replayed_at is None else f"{short_path(_replayed_at[0])}:{_replayed_at[1]}"


def user_location(depth: int = 1) -> tuple[str, int] | None:
    """(filename, lineno) of the innermost user frame of the running code, else None (cheap: no source read)."""
    frame = sys._getframe(depth)
    while frame is not None:
        if frame_kind(frame.f_code.co_filename) == "user":
            return frame.f_code.co_filename, frame.f_lineno
        frame = frame.f_back
    return None


def _line(filename: str, lineno: int) -> tuple[str, str | None]:
    return f"{short_path(filename)}:{lineno}", linecache.getline(filename, lineno).strip() or None


def op_frames(depth: int = 1) -> tuple[tuple[str, str | None] | None, tuple[str, str | None] | None]:
    """(("file.py:57", code) of the running code's frame to show, ("lib/file.py:89", code) of the installed
    library's line beside it) (see pick_frames), each None where there is none. Where the stack holds no user
    frame of its own and a replay is calling recorded user code (replayed_at), the line that made the call in the
    run is shown, and the stack's library frame beside it."""
    frames = []
    frame = sys._getframe(depth)
    while frame is not None:
        frames.append(frame)
        frame = frame.f_back
    i, j, own = pick_frames(f.f_code.co_filename for f in frames)
    if _replayed_at is not None and not own:
        j = i  # (the stack's library line is where the op ran inside the recorded call)
        shown = _line(*_replayed_at)
    elif i is None:
        return None, None
    else:
        shown = _line(frames[i].f_code.co_filename, frames[i].f_lineno)
    beside = _line(frames[j].f_code.co_filename, frames[j].f_lineno) if j is not None else None
    return shown, (beside if beside is None or beside[0] != shown[0] else None)


def user_frame(depth: int = 1) -> tuple[str | None, str | None]:
    """("file.py:57", code) of the running code's frame to show (op_frames), else (None, None)."""
    shown, _ = op_frames(depth + 1)
    return shown if shown is not None else (None, None)


def user_frame_inside(code) -> tuple[str, str | None] | None:
    """("file.py:57", code line) of the innermost user frame at or inside the running frame of `code` (a custom
    autograd Function's backward, which autograd runs with no frame of the line that built the node), else None."""
    frame, inner = sys._getframe(1), None
    while frame is not None:
        if inner is None and frame_kind(frame.f_code.co_filename) == "user":
            inner = frame
        if frame.f_code is code:
            inner = inner or frame
            return (f"{short_path(inner.f_code.co_filename)}:{inner.f_lineno}",
                    linecache.getline(inner.f_code.co_filename, inner.f_lineno).strip() or None)
        frame = frame.f_back
    return None


def _stack_entries(lines: list[str]) -> list[tuple[str, int, str | None]]:
    """(filename, lineno, code) of each entry of a formatted stack, innermost first."""
    out = []
    for entry in reversed(lines or []):
        rows = entry.strip("\n").splitlines()
        head = rows[0].strip() if rows else ""  # 'File "x.py", line 57, in forward'
        try:
            filename = head.split('"')[1]
            lineno = int(head.split("line ")[1].split(",")[0])
        except (IndexError, ValueError):
            continue
        out.append((filename, lineno, rows[1].strip() if len(rows) > 1 and rows[1].strip() else None))
    return out


def frames_from_stack_lines(lines: list[str]) -> tuple[str | None, tuple[str, str | None] | None]:
    """("file.py:57" of the innermost user frame of the user's own code, or None; ("lib/file.py:89", code) of the
    installed library's line inside it, or None) from a formatted stack (traceback.format_stack, outermost
    first, as anomaly mode stores it for each autograd node)."""
    entries = _stack_entries(lines)
    i, j, own = pick_frames(f for f, _, _ in entries)
    if not own:
        return None, None
    beside = None if j is None else (f"{short_path(entries[j][0])}:{entries[j][1]}", entries[j][2])
    return f"{short_path(entries[i][0])}:{entries[i][1]}", beside


def library_from_stack_lines(lines: list[str]) -> tuple[str, str | None] | None:
    """("lib/file.py:89", code) of the innermost installed frame of a formatted stack that holds no user frame of
    its own (a recorded call replayed by the tool), else None."""
    entries = _stack_entries(lines)
    i, _, own = pick_frames(f for f, _, _ in entries)
    return None if own or i is None else (f"{short_path(entries[i][0])}:{entries[i][1]}", entries[i][2])


def source_from_stack_lines(lines: list[str]) -> str | None:
    """"file.py:57" from a formatted stack (outermost first): the innermost frame of the user's own code, or
    None."""
    return frames_from_stack_lines(lines)[0]


def user_frame_of_traceback(summaries) -> object | None:
    """The innermost user FrameSummary of traceback.extract_tb(...) (outermost first), else None."""
    for frame in reversed(list(summaries)):
        if frame_kind(frame.filename) == "user":
            return frame
    return None


# -- whose exception: a call debug-nan passes through is its caller's ---------------------------------------------
_THROUGH = "_debug_nan_passed_through"  # attribute of an exception: ids of the tool frames it passed through


def passed_through(exc: BaseException) -> None:
    """Called in an `except` around a call debug-nan makes on the script's behalf (the recorder's torch call, a
    wrapped `backward()`, `GradScaler.scale`): the frame catching `exc` only passed it on, so the exception is
    still the script's. Marks that frame (the first of `exc.__traceback__`, the one handling it now)."""
    tb = exc.__traceback__
    if tb is None:
        return
    try:
        marks = exc.__dict__.setdefault(_THROUGH, set())
    except (AttributeError, TypeError):  # (an exception type without a __dict__: blamed by its frames alone)
        return
    marks.add(id(tb.tb_frame))


class _CallsThrough:
    """`with calls_through: original(...)`: an exception raised inside is the caller's (see passed_through). A class,
    not a generator: its __exit__ gets the traceback whose first frame is the one running the `with`."""

    def __enter__(self):
        return self

    def __exit__(self, kind, exc, tb) -> bool:
        if exc is not None:
            passed_through(exc)
        return False


calls_through = _CallsThrough()


def raising_tool_frame(exc: BaseException) -> tuple[str, int] | None:
    """(filename, lineno) of the debug-nan frame an exception started in, or None when it is the script's: the
    innermost frame of its traceback outside torch and the standard library that is not a frame debug-nan only
    passed the call through (passed_through). A bug in debug-nan's own code has a tool frame there; an error of
    a torch call the script made, wherever debug-nan's recorder or hooks sit on the stack, has the script's."""
    marks = getattr(exc, _THROUGH, ())
    stdlib = os.path.dirname(os.__file__)
    for frame, lineno in reversed(list(traceback.walk_tb(exc.__traceback__))):
        filename = frame.f_code.co_filename
        kind = frame_kind(filename)
        if kind in ("torch", "plumbing") or filename.startswith((stdlib, "<frozen")) or id(frame) in marks:
            continue
        return (filename, lineno) if kind == "tool" else None
    return None
