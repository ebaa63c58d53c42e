"""--tensorboard DIR: the run's history as TensorBoard scalars and the finding as text, written once at the end of
the run from the History (nothing on the hot path; a long run's per-layer values are as thinned as the JSON
report's). Needs the `tensorboard` package (the project's `tensorboard` extra).

Tags: `loss`, `loss_part/NAME`, `grad_norm/total`, `lr`, `loss_scale` (fp16), and per module that owns parameters
`max_abs_activation/PATH` and `grad_norm/PATH`; text `status` and `finding`. NaN/Inf values are written as they
were (TensorBoard draws them as gaps or at the edge). The event file is written in a temporary folder inside DIR
and then moved into DIR (a new file name per run: nothing earlier is overwritten, a reader never sees half a file).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from debug_nan.engine.watch.history import History
from debug_nan.errors import InputError, require_package
from debug_nan.presentation.history_rows import build_rows
from debug_nan.presentation.outputs import OutputWriteError

if TYPE_CHECKING:  # (a type only: the top process of `run -- PROGRAM` renders its ranks' results without torch)
    from torch import nn


def check_tensorboard(path: str | None) -> None:
    """Before the run: the package is there and DIR is (or can become) a writable folder (exit 2 otherwise)."""
    if not path:
        return
    require_package("tensorboard", f"--tensorboard {path} needs the tensorboard package: pip install tensorboard "
                    f"(or the project's extra: pip install -e '.[tensorboard]').")
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise InputError(f"--tensorboard {path} is a file; give a folder (TensorBoard's --logdir).")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        tempfile.TemporaryDirectory(dir=folder).cleanup()
    except OSError as exc:
        raise InputError(f"--tensorboard {path}: cannot write there ({exc.strerror or exc}).") from None


def scalars(history: History, model: nn.Module) -> dict[str, list[tuple[int, float]]]:
    """tag -> [(step, value)] for every scalar written."""
    out: dict[str, list[tuple[int, float]]] = {}

    def put(tag: str, step: int, value: float | None) -> None:
        if value is not None:
            out.setdefault(tag, []).append((step, float(value)))

    for r in history.steps:
        put("loss", r.step, r.loss)
        for name, value in r.parts.items():
            put(f"loss_part/{name}", r.step, value)
        put("grad_norm/total", r.step, r.grad_norm)
        put("lr", r.step, r.lr)
        put("loss_scale", r.step, getattr(r, "loss_scale", None))
    steps = [r.step for r in history.steps]
    for row in build_rows(history, model, full=True):
        name = row.name or "<model>"
        for step, act, grad in zip(steps, row.acts, row.grads):
            put(f"max_abs_activation/{name}", step, act)
            put(f"grad_norm/{name}", step, grad)
    return out


def write_tensorboard(path: str, history: History, model: nn.Module, texts: dict[str, str]) -> str:
    """Write one event file into `path` (texts: tag -> markdown) and return its path; OutputWriteError when it
    cannot be written."""
    # (the tensorboard package's own writer, as torch.utils.tensorboard's FileWriter wraps it: no torch here)
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.plugins.text.summary_v2 import text_pb
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    folder = Path(path)
    staging = None
    try:
        folder.mkdir(parents=True, exist_ok=True)
        staging = tempfile.mkdtemp(dir=folder, prefix=".debug-nan-")
        writer = EventFileWriter(staging)
        per_step: dict[int, list] = {}  # one event per step holding all its values (not one event per value)
        for tag, points in scalars(history, model).items():
            for step, value in points:
                per_step.setdefault(step, []).append(Summary.Value(tag=tag, simple_value=value))
        for step in sorted(per_step):
            writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=per_step[step])))
        last = history.steps[-1].step if history.steps else 0
        for tag, markdown in texts.items():
            # (the text plugin's tag, `TAG/text_summary`, as torch.utils.tensorboard's summary.text names it)
            summary = text_pb(f"{tag}/text_summary", [markdown])
            writer.add_event(Event(wall_time=time.time(), step=last, summary=summary))
        writer.close()
        (event,) = [p for p in Path(staging).iterdir() if p.name.startswith("events.out.tfevents")]
        target = folder / event.name
        os.replace(event, target)
        return str(target)
    except (OSError, RuntimeError, ValueError) as exc:
        raise OutputWriteError(f"--tensorboard {path}: could not be written ({getattr(exc, 'strerror', None) or exc})"
                               f"; nothing was left half-written there.") from None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def finding_markdown(lines: list[str]) -> str:
    """The summary's lines as a preformatted block (TensorBoard's text plugin renders markdown)."""
    return "\n".join("    " + line for line in lines)
