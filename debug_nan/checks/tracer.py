"""Tier 2, the operator-level tracer: used only to replay the failing micro-batch.

A TorchDispatchMode sees every aten operation, in forward, loss, backward and the optimizer. The origin is the
first operation that gives birth to a non-finite value:
  * a NaN in its output while no input held a NaN, or
  * an Inf in its output while every input was finite and no scalar argument was +-inf (an `-inf` written by
    masked_fill / fill / full / where for masking is deliberate and not a finding).
Module context: forward pre/post hooks keep a stack of module paths. For backward, each module's post-hook tags
the autograd nodes its forward created (node.metadata), and during backward the running node is asked for its
tag; anomaly mode keeps each node's forward traceback, which gives backward ops their source line.
"""

from __future__ import annotations

import math
import os
import sys
import warnings
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import debug_nan

TAG = "debug_nan_module"
TORCH_DIR = os.path.dirname(torch.__file__)
_PKG = os.path.dirname(os.path.abspath(debug_nan.__file__))
# frames that are the tool, not the user's code: the checks, and the driver that calls the user's code
TOOL_FILES = tuple(os.path.join(_PKG, sub) for sub in ("checks", os.path.join("train", "loop.py"),
                                                       os.path.join("train", "task.py"), "runner.py", "cli.py"))
DRIVER_FILES = TOOL_FILES[1:]
# torch's plumbing (wrappers, dispatch): never the line to show, even when no user frame exists
TORCH_PLUMBING = tuple(os.path.join(TORCH_DIR, sub) for sub in ("_dynamo", "utils", "_ops.py", "_tensor.py",
                                                                  "overrides.py", "autograd", "_compile.py"))


@dataclass
class OpEvent:
    """The birth of the first non-finite value: the op, where it ran, and its tensors (kept for diagnosis)."""

    op: str
    phase: str
    module: str
    module_type: str
    kind: str  # "nan" | "inf"
    source: str | None
    source_line: str | None
    backward_node: str | None
    forward_source: str | None
    inputs: list[tuple[str, torch.Tensor]]
    outputs: list[tuple[str, torch.Tensor]]
    scalars: dict[str, object] = field(default_factory=dict)
    func: object = None
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    node: object = None  # the running autograd node (backward only)
    saved: dict[str, torch.Tensor] = field(default_factory=dict)  # its saved forward tensors (_saved_self, ...)


def _has_nan(t: torch.Tensor) -> bool:
    return t.is_floating_point() and bool(torch.isnan(t).any())


def _has_nonfinite(t: torch.Tensor) -> bool:
    """One aminmax reduction (min/max propagate NaN and show +-Inf): several times faster than isfinite().all()."""
    if t.is_complex():
        return not bool(torch.isfinite(t).all())
    if not t.is_floating_point() or t.numel() == 0:
        return False
    lo, hi = torch.aminmax(t.detach())
    return not bool(torch.isfinite(torch.stack([lo, hi])).all())


def _named_tensors(func, args, kwargs) -> tuple[list[tuple[str, torch.Tensor]], dict[str, object]]:
    """Tensor arguments by schema name (lists expanded as name[i]) and the non-tensor arguments."""
    names = [a.name for a in func._schema.arguments]
    tensors, scalars = [], {}
    bound = list(zip(names, args)) + list(kwargs.items())
    for name, value in bound:
        if isinstance(value, torch.Tensor):
            tensors.append((name, value))
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
            tensors += [(f"{name}[{i}]", v) for i, v in enumerate(value)]
        else:
            scalars[name] = value
    return tensors, scalars


def _scalar_is_inf(scalars: dict[str, object]) -> bool:
    flat, _ = tree_flatten(list(scalars.values()))
    return any(isinstance(v, float) and math.isinf(v) for v in flat)


def user_frame() -> tuple[str | None, str | None]:
    """("file.py:57", code) of the innermost frame outside torch and the tool, else the innermost outside the tool."""
    frame = sys._getframe(1)
    fallback = found = None
    while frame is not None:
        fname = frame.f_code.co_filename
        if fname.startswith(DRIVER_FILES):
            break  # called by the tool itself (e.g. the optimizer step): the innermost library frame it is
        if not fname.startswith(TOOL_FILES):
            if fallback is None and not fname.startswith(TORCH_PLUMBING):
                fallback = frame
            if not fname.startswith(TORCH_DIR):
                found = frame
                break
        frame = frame.f_back
    frame = found or fallback
    if frame is None:
        return None, None
    import linecache

    code = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip() or None
    return f"{_short(frame.f_code.co_filename)}:{frame.f_lineno}", code


PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.abspath(debug_nan.__file__)))


def _short(path: str) -> str:
    """debug_nan/... for the tool's own files, a path relative to the working directory when inside it, else
    the last two components."""
    if path.startswith(PACKAGE_PARENT + os.sep) and "site-packages" not in os.path.relpath(path, PACKAGE_PARENT):
        return os.path.relpath(path, PACKAGE_PARENT)
    if "site-packages" + os.sep in path:  # an installed library: torch/optim/adam.py
        return path.split("site-packages" + os.sep, 1)[1]
    try:
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            return rel
    except ValueError:
        pass
    return os.path.join(os.path.basename(os.path.dirname(path)), os.path.basename(path))


def forward_source_of(node) -> str | None:
    """The user line that created an autograd node, from anomaly mode's stored traceback."""
    frames = node.metadata.get("traceback_") if node is not None else None
    if not frames:
        return None
    for entry in reversed(frames):
        line = entry.strip().splitlines()[0]  # '  File "x.py", line 57, in forward'
        if TORCH_DIR in line or any(t in line for t in TOOL_FILES):
            continue
        try:
            fname = line.split('"')[1]
            lineno = line.split("line ")[1].split(",")[0]
            return f"{_short(fname)}:{lineno}"
        except IndexError:
            continue
    return None


def _saved_tensors(node) -> dict[str, torch.Tensor]:
    """The forward tensors an autograd node saved, read while it runs (they are freed after backward)."""
    out = {}
    for attr in dir(node):
        if attr.startswith("_saved_") and not attr.endswith("_raw"):
            try:
                value = getattr(node, attr)
            except RuntimeError:
                continue
            if isinstance(value, torch.Tensor):
                out[attr[len("_saved_"):]] = value.detach().clone()
    return out


# ops whose output is uninitialised memory (it may hold an old NaN) or that overwrite their destination whole:
# the destination's old contents are not an input
UNINITIALISED = ("empty", "empty_like", "new_empty", "empty_strided", "new_empty_strided", "empty_permuted")
OVERWRITING = ("copy_", "fill_", "zero_", "uniform_", "normal_", "random_", "bernoulli_", "exponential_",
               "geometric_", "cauchy_", "log_normal_", "set_", "_foreach_copy_", "_foreach_zero_")


def _op_name(func) -> str:
    return func._schema.name.split("::")[-1]


class StopReplay(Exception):
    """Raised from inside the traced op once the origin is recorded: the rest of the replay is not needed."""


class Tracer(TorchDispatchMode):
    """Records the first op that gives birth to a NaN/Inf. Use as a context manager around the replay.

    `phase` is set by the replay driver to "optimizer" around the optimizer step; otherwise the phase is derived:
    backward while autograd runs, forward inside a module of `model`, loss outside any module."""

    def __init__(self, model: nn.Module, stop_at_first: bool = False):
        super().__init__()
        self.stop_at_first = stop_at_first
        self.model = model
        self.names = {m: n for n, m in model.named_modules()}
        self.stack: list[str] = []
        self.phase_override: str | None = None
        self.first: OpEvent | None = None
        self.ops_seen = 0
        self.module_inf: OpEvent | None = None  # an Inf (from masking) that reached a module output
        self._last_inf: OpEvent | None = None
        self._handles = []
        self._stop_nodes: list[set[int]] = []
        self._anomaly = None

    # -- module context --------------------------------------------------------------------------------------
    def _pre(self, module, inputs, kwargs):
        self.stack.append(self.names[module])
        stops = set()
        for t in tree_flatten((inputs, kwargs))[0]:
            if isinstance(t, torch.Tensor) and t.grad_fn is not None:
                stops.add(id(t.grad_fn))
        self._stop_nodes.append(stops)

    def _post(self, module, inputs, output):
        name = self.stack.pop() if self.stack else self.names[module]
        stops = self._stop_nodes.pop() if self._stop_nodes else set()
        todo = [t.grad_fn for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node is None or id(node) in stops or TAG in node.metadata:
                continue
            node.metadata[TAG] = name
            todo.extend(n for n, _ in node.next_functions if n is not None)
        if self.first is None and self.module_inf is None and self._last_inf is not None:
            for t in tree_flatten(output)[0]:
                if isinstance(t, torch.Tensor) and t.is_floating_point() and bool(torch.isinf(t).any()):
                    self.module_inf = self._last_inf
                    break

    def __enter__(self):
        for m in self.names:
            self._handles.append(m.register_forward_pre_hook(self._pre, with_kwargs=True))
            self._handles.append(m.register_forward_hook(self._post))
        self._anomaly = torch.autograd.set_detect_anomaly(True, check_nan=False)
        warnings.filterwarnings("ignore", message=".*anomaly.*")
        warnings.filterwarnings("ignore", message="Error detected in")  # anomaly mode on a stopped replay
        self._anomaly.__enter__()
        return super().__enter__()

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            self._anomaly.__exit__(None, None, None)
            for h in self._handles:
                h.remove()
            self._handles = []
            self.stack = []

    # -- where are we ----------------------------------------------------------------------------------------
    def _context(self) -> tuple[str, str, object]:
        """(phase, module path, running autograd node or None)."""
        if self.phase_override:
            return self.phase_override, "", None
        node = torch._C._current_autograd_node()
        if node is not None:
            return "backward", node.metadata.get(TAG, ""), node
        if self.stack:
            return "forward", self.stack[-1], None
        return "loss", "", None

    def _module_type(self, path: str) -> str:
        try:
            return type(self.model.get_submodule(path)).__name__ if path else type(self.model).__name__
        except AttributeError:
            return ""

    # -- the interception ------------------------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.first is not None:
            return func(*args, **kwargs)
        self.ops_seen += 1
        name = _op_name(func)
        if name in UNINITIALISED:  # garbage by definition; what is written into it later is judged
            return func(*args, **kwargs)
        mutable = func._schema.is_mutable
        before = None
        if mutable:  # an in-place op overwrites its input: judge the inputs before it runs
            tensors, _ = _named_tensors(func, args, kwargs)
            overwritten = name in OVERWRITING
            before = [(n, t.detach().clone()) for n, t in tensors
                      if n != "out" and not (overwritten and n == "self")]
        out = func(*args, **kwargs)
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        if not outs and mutable:
            outs = [t for _, t in _named_tensors(func, args, kwargs)[0]]
        bad = [t for t in outs if _has_nonfinite(t)]
        if not bad:
            return out
        tensors, scalars = _named_tensors(func, args, kwargs)
        inputs = before if before is not None else tensors
        out_nan = any(_has_nan(t) for t in bad)
        in_nan = any(_has_nan(t) for _, t in inputs)
        in_nonfinite = any(_has_nonfinite(t) for _, t in inputs)
        if out_nan and not in_nan:
            kind = "nan"
        elif not out_nan and not in_nonfinite and not _scalar_is_inf(scalars):
            kind = "inf"
        else:
            if not out_nan and not in_nonfinite:
                self._last_inf = self._event(func, "inf", inputs, outs, scalars, args, kwargs)
            return out
        self.first = self._event(func, kind, inputs, outs, scalars, args, kwargs)
        if self.stop_at_first:
            raise StopReplay
        return out

    def _event(self, func, kind, inputs, outs, scalars, args, kwargs) -> OpEvent:
        phase, module, node = self._context()
        source, code = user_frame()
        forward_source = None
        saved = {}
        if node is not None:
            forward_source = forward_source_of(node)
            source, code = forward_source, None
            saved = _saved_tensors(node)
        return OpEvent(
            op=str(func), phase=phase, module=module, module_type=self._module_type(module) if phase != "loss" else "",
            kind=kind, source=source, source_line=code, backward_node=node.name() if node is not None else None,
            forward_source=forward_source, inputs=[(n, t.detach()) for n, t in inputs],
            outputs=[(f"out[{i}]" if len(outs) > 1 else "out", t.detach()) for i, t in enumerate(outs)],
            scalars={k: v for k, v in scalars.items() if not isinstance(v, torch.Tensor)}, func=func, node=node, args=args, kwargs=kwargs, saved=saved,
        )
