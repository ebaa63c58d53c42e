"""Which module is running, and which module's forward made each autograd node (for the tracer).

Forward pre/post hooks keep a stack of module paths. Each autograd node is tagged (node.metadata) with the
module on top of the stack when the op that created it ran: autograd attaches the node right after the op
returns, so the op's outputs wait in `pending` and are tagged at the next op or hook. That puts a backward op in
the innermost module whose forward made it, including ops in a parent's own body upstream of a child call. A
module's post-hook also tags untagged nodes reachable from its outputs (a custom autograd.Function's own node,
which no traced op creates). The source line of a backward op is its node's forward line, except in a custom
Function's own backward, whose line is the op's.
`global_hooks`: the hooks are registered globally (torch.nn.modules.module.register_module_forward_*_hook) and
filtered to the model's modules, so no module carries a hook of its own: torch's inference fast paths
(nn.TransformerEncoderLayer, nn.MultiheadAttention) refuse to run when a module has forward hooks, and an eval
replay must take the path the run took.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from debug_nan.engine.sharded import user_class, user_path
from debug_nan.frames import frames_from_stack_lines, library_from_stack_lines, replayed_source, user_frame_inside

TAG = "debug_nan_module"
ORIGIN_TAG = "debug_nan_origin"  # on the node of a forward op that was an origin: that origin's id
SOURCE_TAG = "debug_nan_source"  # the user line of a replayed recorded call (frames.replayed_at) that made it
LOSS_CODE = "<loss code>"  # the TAG of a node made outside every module of the model (its path is "", the root's)


def forward_source_of(node) -> str | None:
    """The user line that created an autograd node: the innermost line of the user's own code in anomaly mode's
    stored traceback, else (a replayed recorded call, whose stack is the replay's) the line that made it in the
    run."""
    if node is None:
        return None
    return frames_from_stack_lines(node.metadata.get("traceback_"))[0] or node.metadata.get(SOURCE_TAG)


def forward_inside_of(node) -> tuple[str, str | None] | None:
    """("lib/file.py:89", code) of the installed library's line where the op that created an autograd node ran
    (torch.nn.functional, transformers' modeling code), from the same traceback; None when the user's own code
    made it directly."""
    if node is None:
        return None
    lines = node.metadata.get("traceback_")
    source, inside = frames_from_stack_lines(lines)
    return inside if source is not None else library_from_stack_lines(lines)


def custom_backward_line(node) -> tuple[str, str | None] | None:
    """For an op that a custom autograd.Function's own backward runs: its line there (the node's forward line is
    where the Function was applied, which says nothing of the op)."""
    backward = getattr(getattr(node, "_forward_cls", None), "backward", None)
    code = getattr(backward, "__code__", None)
    return user_frame_inside(code) if code is not None else None


class ModuleContext:
    def __init__(self, model: nn.Module, on_output=None):
        """on_output(output, path): called after each module's forward (with the module's output and path)."""
        self.model = model
        self.names = {m: user_path(n) for n, m in model.named_modules()}  # (as the user wrote them: no wrapper)
        self._by_path = {path: m for m, path in self.names.items()}  # (a wrapper's inner module wins: it comes later)
        self.stack: list[str] = []
        self.on_output = on_output
        self._handles = []
        self._stop_nodes: list[dict[int, object]] = []
        self._pending: list[list] = []  # [op outputs, module, origin or None]: their autograd node is tagged next
        self._classes: dict[str, tuple[str, str]] = {}
        self.global_hooks = False

    def attach(self) -> None:
        if self.global_hooks:
            from torch.nn.modules import module as nn_module

            self._handles.append(nn_module.register_module_forward_pre_hook(
                lambda m, inputs: self._pre(m, inputs, {}) if m in self.names else None))
            self._handles.append(nn_module.register_module_forward_hook(
                lambda m, inputs, output: self._post(m, inputs, output) if m in self.names else None))
            return
        for m in self.names:
            self._handles.append(m.register_forward_pre_hook(self._pre, with_kwargs=True))
            self._handles.append(m.register_forward_hook(self._post))

    def detach(self) -> None:
        self.tag_pending()
        for h in self._handles:
            h.remove()
        self._handles = []
        self.stack = []

    def current(self) -> str:
        """The innermost running module's path ("" outside any module)."""
        return self.stack[-1] if self.stack else ""

    def module_class(self, path: str) -> tuple[str, str]:
        """(class name, "package.module.Class") of the module at `path` ("" = the model)."""
        if path not in self._classes:
            try:
                cls = user_class(type(self._by_path[path]) if path in self._by_path
                                 else type(self.model.get_submodule(path)))
                self._classes[path] = (cls.__name__, f"{cls.__module__}.{cls.__qualname__}")
            except AttributeError:
                self._classes[path] = ("", "")
        return self._classes[path]

    # -- tagging ---------------------------------------------------------------------------------------------------
    def remember(self, outs: list[torch.Tensor], written: list[torch.Tensor]) -> list | None:
        """An op (in forward or loss, grad enabled) just ran: tag the nodes autograd attaches to its outputs at
        the next op or hook. Returns the pending entry, whose last slot takes the origin the op was, if any."""
        if not torch.is_grad_enabled() or torch._C._current_autograd_node() is not None:
            return None
        bases = [t._base for t in written if t._base is not None]  # an in-place op on a view rebases its base
        entry = [outs + bases, self.current() if self.stack else LOSS_CODE, None, replayed_source()]
        self._pending.append(entry)
        return entry

    def tag_pending(self) -> None:
        pending, self._pending = self._pending, []
        for tensors, module, origin, source in pending:
            for t in tensors:
                node = t.grad_fn
                if node is None:
                    continue
                meta = node.metadata
                if TAG not in meta:
                    meta[TAG] = module
                if source is not None and SOURCE_TAG not in meta:
                    meta[SOURCE_TAG] = source
                if origin is not None and ORIGIN_TAG not in meta:
                    meta[ORIGIN_TAG] = origin.id

    # -- hooks -----------------------------------------------------------------------------------------------------
    def _pre(self, module, inputs, kwargs):
        self.tag_pending()
        self.stack.append(self.names[module])
        self._stop_nodes.append({id(t.grad_fn): t.grad_fn for t in tree_flatten((inputs, kwargs))[0]
                                 if isinstance(t, torch.Tensor) and t.grad_fn is not None})

    def _post(self, module, inputs, output):
        self.tag_pending()
        name = self.stack.pop() if self.stack else self.names[module]
        stops = self._stop_nodes.pop() if self._stop_nodes else {}
        todo = [t.grad_fn for t in tree_flatten(output)[0] if isinstance(t, torch.Tensor) and t.grad_fn is not None]
        while todo:
            node = todo.pop()
            if node is None or id(node) in stops or TAG in node.metadata:
                continue
            node.metadata[TAG] = name
            todo.extend(n for n, _ in node.next_functions if n is not None)
        if self.on_output is not None:
            self.on_output(output, name)
