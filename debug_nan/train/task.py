"""The task plug-in: `--task FILE.py:NAME` or `--task package.module:NAME`.

NAME is a callable taking no argument or one (the run's RunSettings). It returns an object with
  model      torch.nn.Module
  batches    iterable of micro-batches (tensors, or dicts/tuples/lists of them; other values pass through)
  loss(model, batch) -> scalar tensor, or a dict whose "loss" entry is the scalar (other scalar entries are logged)
  optimizer(params) -> torch.optim.Optimizer          (optional; default AdamW at --lr)
  describe_batch(batch) -> list[str]                   (optional; data checks printed each step)
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import torch

from debug_nan.errors import InputError, describe_exception


@dataclass
class Task:
    model: torch.nn.Module
    batches: Iterable
    loss: Callable[[torch.nn.Module, Any], Any]
    optimizer: Callable | None = None
    describe_batch: Callable[[Any], list[str]] | None = None
    name: str = "task"
    notes: list[str] = field(default_factory=list)
    spec: str | None = None  # how to load it again (for repro bundles); None for the built-in task


def _import_target(spec: str):
    """Resolve 'path/to/file.py:NAME' or 'package.module:NAME' to the object NAME."""
    if ":" not in spec:
        raise InputError(f"--task {spec!r} must be FILE.py:NAME or package.module:NAME (the colon names the "
                         f"callable that builds the task).")
    where, name = spec.rsplit(":", 1)
    try:
        if where.endswith(".py") or "/" in where or "\\" in where:
            path = Path(where)
            if not path.is_file():
                raise InputError(f"--task file {path} does not exist.")
            mod_name = f"debug_nan_task_{abs(hash(str(path.resolve())))}"
            module_spec = importlib.util.spec_from_file_location(mod_name, path)
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
    except Exception as exc:
        raise InputError(f"--task {spec}: importing {where} failed with {describe_exception(exc)}.") from None
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
    if get("optimizer") is not None and not callable(get("optimizer")):
        problems.append("`optimizer(params)` must be callable when given")
    if problems:
        raise InputError(f"--task {spec} returned a {type(obj).__name__} that is not a task: "
                         f"{'; '.join(problems)}. See the README section 'Debug your own model'.")
    return Task(model=model, batches=batches, loss=get("loss"), optimizer=get("optimizer"),
                describe_batch=get("describe_batch"), name=spec.rsplit(":", 1)[-1], spec=spec)


def load_task(spec: str, settings) -> Task:
    """Import and call the task factory, and check the shape of what it returns."""
    factory = _import_target(spec)
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
    except Exception as exc:
        raise InputError(f"--task {spec}: calling it raised {describe_exception(exc)}.") from None
    return _check(obj, spec)
