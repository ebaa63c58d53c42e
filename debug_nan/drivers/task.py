"""The task plug-in: `--task FILE.py:NAME` or `--task package.module:NAME`.

NAME is a callable taking no argument or one (the run's settings, flat, each by its option's name). It returns an
object (or a dict) with
  model      torch.nn.Module (a torch.compile'd one is debugged through its eager module, with a notice)
  batches    iterable of micro-batches (tensors, or dicts/tuples/lists of them; other values pass through)
  loss(model, batch) -> scalar tensor, or a dict whose "loss" entry is the scalar (other scalar entries are logged)
  optimizer(params) -> torch.optim.Optimizer          (optional; default AdamW at --lr / --weight-decay)
  scheduler(optimizer) -> an LR scheduler              (optional; stepped once per optimizer step, no argument)
  max_grad_norm: float                                 (optional; clip the total gradient norm to it)
  describe_batch(batch) -> list[str]                   (optional; data checks printed each step)
  eval_batches                                         (optional; held-out batches for --eval-every)
  eval_loss(model, batch) or evaluate(model, batch)   (optional; the eval pass's loss / metrics dict; default:
                                                        loss(model, batch), run under eval() + no_grad)
  load_checkpoint(path, model, optimizer) -> step|None (optional; --checkpoint for a layout of its own)

The debug run is the task's own run: nothing is added to its recipe. No clipping, warmup or schedule unless the
task asks for it (above) or an explicit --max-grad-norm / --warmup-steps (or config key) does; an explicit flag
replaces the task's own. The model is put in training mode once before the first step, as a training loop does
(a submodule the task left in eval mode stays in eval mode), never per forward.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import inspect
import linecache
import math
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from debug_nan.errors import InputError, describe_exception
from debug_nan.frames import short_path, user_frame_of_traceback


@dataclass
class Task:
    model: torch.nn.Module
    batches: Iterable
    loss: Callable[[torch.nn.Module, Any], Any]
    optimizer: Callable | None = None
    scheduler: Callable | None = None
    max_grad_norm: float | None = None
    describe_batch: Callable[[Any], list[str]] | None = None
    name: str = "task"
    notes: list[str] = field(default_factory=list)
    spec: str | None = None  # how to load it again (for repro bundles); None for the built-in task
    eval_batches: Iterable | None = None
    eval_loss: Callable[[torch.nn.Module, Any], Any] | None = None  # eval_loss or evaluate, whichever is given
    load_checkpoint: Callable | None = None


def split_loss(out) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A task's loss output -> (scalar loss, other scalar entries)."""
    parts = {}
    if isinstance(out, dict):
        if "loss" not in out:
            raise TypeError(f"the task's loss returned a dict without a 'loss' entry (keys: {sorted(out)})")
        parts = {k: v for k, v in out.items() if k != "loss" and isinstance(v, torch.Tensor) and v.numel() == 1}
        out = out["loss"]
    if not isinstance(out, torch.Tensor) or out.numel() != 1:
        shape = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise TypeError(f"the task's loss must return a scalar tensor (got {shape})")
    return out.reshape(()), parts


def micro_batches(task: Task, dist_ctx=None):
    """Micro-batches forever, re-iterating task.batches. Under DDP each rank takes every world-th micro-batch
    (unless the task shards itself, like the built-in one), counted across passes, so even a single batch
    reaches every rank."""
    shard = dist_ctx is not None and not getattr(task.batches, "sharded", False)
    dealt = 0
    while True:
        produced = 0
        for batch in _guarded(task, dealt):
            produced += 1
            if not shard or dealt % dist_ctx.world == dist_ctx.rank:
                yield batch
            dealt += 1
        if produced == 0:
            if dealt:
                raise InputError(f"The task's `batches` ({task.name}) ran dry after {dealt} micro-batches: give an "
                                 f"iterable that starts over when iterated again (a list, or an object whose "
                                 f"__iter__ restarts), not a one-shot generator.")
            raise InputError(f"The task's `batches` ({task.name}) yielded no micro-batch.")


def _guarded(task: Task, dealt: int):
    """One pass over task.batches; an exception raised by the task's own iterator (or a sys.exit in it) is bad
    input naming the micro-batch, not a bare IndexError from deep inside the loop."""
    try:
        iterator = iter(task.batches)
    except Exception as exc:  # noqa: BLE001 - user code
        raise InputError(f"The task's `batches` ({task.name}): iter() raised {describe_exception(exc)}.") from None
    produced = 0
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            return
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - user code
            raise InputError(f"The task's `batches` ({task.name}) raised {_describe(exc)} while producing "
                             f"micro-batch {dealt + produced + 1} (counted over every pass): fix the task's data "
                             f"pipeline.") from None
        produced += 1
        yield batch


def _describe(exc: BaseException) -> str:
    """describe_exception, with a sys.exit named as such and without importlib's frozen frames (a SyntaxError
    names the file and line of the bad code)."""
    if isinstance(exc, SystemExit):
        return f"SystemExit (sys.exit({exc.code!r}))" + _where(exc)
    if isinstance(exc, SyntaxError) and exc.filename:
        code = f": {exc.text.strip()}" if exc.text and exc.text.strip() else ""
        return f"SyntaxError: {exc.msg} (at {short_path(exc.filename)}:{exc.lineno}{code})"
    return f"{type(exc).__name__}: {exc}" + _where(exc)


def _where(exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen")]
    frame = user_frame_of_traceback(frames)
    return f" (at {short_path(frame.filename)}:{frame.lineno})" if frame is not None else ""


def _no_exit(fn: Callable, what: str) -> Callable:
    """The task's callable, with a sys.exit() inside it turned into an error of the task's code (the run goes on
    to its summary and report instead of the process ending with the task's code)."""
    def call(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except SystemExit as exc:
            raise RuntimeError(f"the task's {what} called sys.exit({exc.code!r})") from None
    call.__wrapped__ = fn
    return call


class _SourceLoader(importlib.abc.Loader):
    """Executes a task file's text as stored in a repro bundle, under the file's own path (so tracebacks and the
    finding's source name it, and linecache shows the stored lines, not those of a changed file on disk)."""

    def __init__(self, path: Path, source: str):
        self.path, self.source = path, source

    def create_module(self, spec):
        return None

    def exec_module(self, module) -> None:
        filename = str(self.path)
        lines = self.source.splitlines(keepends=True)
        linecache.cache[filename] = (len(self.source), None, lines, filename)  # mtime None: never re-read
        module.__file__ = filename
        exec(compile(self.source, filename, "exec"), module.__dict__)


def _import_target(spec: str, source: str | None = None):
    """Resolve 'path/to/file.py:NAME' or 'package.module:NAME' to the object NAME."""
    if ":" not in spec:
        raise InputError(f"--task {spec!r} must be FILE.py:NAME or package.module:NAME (the colon names the "
                         f"callable that builds the task).")
    where, name = spec.rsplit(":", 1)
    try:
        if where.endswith(".py") or "/" in where or "\\" in where:
            path = Path(where)
            if source is None and not path.is_file():
                raise InputError(f"--task file {path} is a folder: give the .py file in it (FILE.py:NAME)."
                                 if path.is_dir() else f"--task file {path} does not exist.")
            mod_name = f"debug_nan_task_{abs(hash(str(path.resolve())))}"
            module_spec = (importlib.util.spec_from_file_location(mod_name, path) if source is None else
                           importlib.util.spec_from_loader(mod_name, _SourceLoader(path.resolve(), source),
                                                           origin=str(path.resolve())))
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[mod_name] = module
            sys.path.insert(0, str(path.resolve().parent))
            try:
                module_spec.loader.exec_module(module)
            finally:
                sys.path.pop(0)
        else:
            module = importlib.import_module(where)
    except InputError:
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - user code
        raise InputError(f"--task {spec}: importing {where} failed with {_describe(exc)}.") from None
    if not hasattr(module, name):
        raise InputError(f"--task {spec}: {where} has no attribute {name!r}.")
    return getattr(module, name)


def _check(obj, spec: str) -> Task:
    problems = []
    model = getattr(obj, "model", None) if not isinstance(obj, dict) else obj.get("model")
    get = (lambda k: obj.get(k)) if isinstance(obj, dict) else (lambda k: getattr(obj, k, None))
    if not isinstance(model, torch.nn.Module):
        problems.append(f"`model` must be a torch.nn.Module (got {type(model).__name__})")
    batches = get("batches")
    if batches is None or not isinstance(batches, Iterable) or isinstance(batches, (str, bytes)):
        problems.append(f"`batches` must be an iterable of micro-batches (got {type(batches).__name__})")
    if not callable(get("loss")):
        problems.append("`loss(model, batch)` must be callable")
    for name in ("optimizer", "scheduler", "describe_batch", "eval_loss", "evaluate", "load_checkpoint"):
        if get(name) is not None and not callable(get(name)):
            problems.append(f"`{name}` must be callable when given")
    clip = get("max_grad_norm")
    if clip is not None and not (isinstance(clip, (int, float)) and not isinstance(clip, bool)
                                 and math.isfinite(clip) and clip >= 0):
        problems.append(f"`max_grad_norm` must be a finite number >= 0 when given (got {clip!r})")
    if isinstance(model, torch.nn.Module) and not any(p.requires_grad for p in model.parameters()):
        count = sum(1 for _ in model.parameters())
        problems.append(f"`model` has no trainable parameter ({count} parameter(s), none with requires_grad=True): "
                        f"there is nothing to train and no gradient to check")
    if isinstance(model, torch.nn.Module):
        meta = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
        if meta:  # no data to train, copy or check: torch.device("meta") builds shapes only
            problems.append(f"`model` is on the meta device ({len(meta)} parameter(s)/buffer(s) without data, e.g. "
                            f"{meta[0]}): materialise it first (model.to_empty(device=...) and initialise it, or "
                            f"load a state dict with assign=True)")
    eval_batches = get("eval_batches")
    if eval_batches is not None and (not isinstance(eval_batches, Iterable) or isinstance(eval_batches, (str, bytes))):
        problems.append(f"`eval_batches` must be an iterable of batches when given (got {type(eval_batches).__name__})")
    if get("eval_loss") is not None and get("evaluate") is not None:
        problems.append("give `eval_loss` or `evaluate`, not both")
    if problems:
        raise InputError(f"--task {spec} returned a {type(obj).__name__} that is not a task: "
                         f"{'; '.join(problems)}. See the README section 'Debug your own model'.")

    def guarded(name: str) -> Callable | None:
        return _no_exit(get(name), name) if get(name) is not None else None

    evaluate = guarded("eval_loss") or guarded("evaluate")
    return Task(model=model, batches=batches, loss=_no_exit(get("loss"), "loss"), optimizer=guarded("optimizer"),
                scheduler=guarded("scheduler"), max_grad_norm=float(clip) if clip is not None else None,
                describe_batch=guarded("describe_batch"), name=spec.rsplit(":", 1)[-1], spec=spec,
                eval_batches=eval_batches, eval_loss=evaluate, load_checkpoint=guarded("load_checkpoint"))


def load_task(spec: str, settings, source: str | None = None) -> Task:
    """Import and call the task factory, and check the shape of what it returns. `source`: the text of a FILE.py
    spec's file to run instead of the file on disk (a repro bundle's stored copy)."""
    factory = _import_target(spec, source)
    if not callable(factory):
        raise InputError(f"--task {spec}: {spec.rsplit(':', 1)[-1]} is a {type(factory).__name__}, not a callable.")
    try:
        n_params = len([p for p in inspect.signature(factory).parameters.values()
                        if p.default is inspect.Parameter.empty and p.kind in (p.POSITIONAL_ONLY,
                                                                                p.POSITIONAL_OR_KEYWORD)])
    except (TypeError, ValueError):
        n_params = 0
    try:
        obj = factory(settings) if n_params >= 1 else factory()
    except InputError:
        raise
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - user code
        raise InputError(f"--task {spec}: calling it raised {_describe(exc)}.") from None
    return _check(obj, spec)
