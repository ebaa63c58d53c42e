"""`debug-nan --help`, grouped: the general options, then one group per component of the settings (training,
checks, the built-in AAM pipeline, outputs: each option lands in the group of the component its setting belongs
to, app/job_settings.py LAYOUT), how to run it distributed, and the --task interface. An option that is no setting
(--config, --version, --help) is in General, so a new option is never missing from the help."""

from __future__ import annotations

import click

from debug_nan.aam.settings import TITLE as AAM_TITLE
from debug_nan.app.job_settings import LAYOUT
from debug_nan.settings import OutputSettings, TrainSettings, WatchSettings

GENERAL = "General options"
SECTIONS = (GENERAL, TrainSettings.TITLE, WatchSettings.TITLE, AAM_TITLE, OutputSettings.TITLE)  # the help's order

DISTRIBUTED = """\
Under torchrun every rank runs the job in DistributedDataParallel (NCCL on CUDA,
gloo on CPU); the ranks agree on a trip every micro-batch, the first rank to see
it pinpoints it; rank 0 writes the log and the report, the others
debug-nan-rankN.log beside the report:
  torchrun --nproc_per_node=4 $(which debug-nan) --max-steps 10 --report r.json
  torchrun --nproc_per_node=2 -m debug_nan --task my_task.py:build --device cpu"""

TASK_INTERFACE = """\
--task FILE.py:NAME (or package.module:NAME) names a callable, taking no
argument or the run's settings, that returns an object or a dict with:
  model               a torch.nn.Module
  batches             an iterable of micro-batches (tensors, or dicts, tuples,
                      lists of them)
  loss(model, batch)  a scalar tensor, or a dict whose "loss" is the scalar
                      (its other entries are logged)
and optionally optimizer(params) (default: AdamW at --lr),
scheduler(optimizer), max_grad_norm, describe_batch(batch) -> lines of data
checks, eval_batches and eval_loss(model, batch) for --eval-every, and
load_checkpoint(path, model, optimizer) for --checkpoint. Nothing is added to
the task's recipe: no clipping, warmup or schedule unless it (or a flag) asks."""


def section_of(param: click.Parameter) -> str:
    place = LAYOUT.places.get(param.name)
    return place.component.TITLE if place is not None else GENERAL


def format_grouped_options(command: click.Command, ctx: click.Context, formatter: click.HelpFormatter) -> None:
    """The options in SECTIONS' order, then the distributed notes and the task interface."""
    rows: dict[str, list[tuple[str, str]]] = {title: [] for title in SECTIONS}
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is not None:
            rows[section_of(param)].append(record)
    for title in SECTIONS:
        if rows[title]:
            with formatter.section(title):
                formatter.write_dl(rows[title])
    for title, text in (("Distributed (torchrun)", DISTRIBUTED), ("Your own model: --task", TASK_INTERFACE)):
        with formatter.section(title):
            for line in text.splitlines():  # laid out already, within 80 columns
                formatter.write(" " * formatter.current_indent + line + "\n")
