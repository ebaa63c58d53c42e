"""`debug-nan --help`, grouped: the general options, the built-in AAM pipeline's, the outputs, how to run it
distributed, and the --task interface. Options are placed by name; one no section names lands in General, so a
new option is never missing from the help."""

from __future__ import annotations

import click

AAM = ("token_limit", "batch_size", "data_dir", "table", "tree", "sequences", "asv_order", "rarefy_depth", "unifrac",
       "synthetic_samples", "d_model", "heads", "asv_layers", "sample_layers", "encoder_layers", "ffn_mult",
       "dropout", "guards", "asv_encoder", "asv_chunk_size", "nuc_weight", "unifrac_weight", "eval_samples")
OUTPUTS = ("report", "log", "plot", "tensorboard", "history", "quiet", "bundle_dir", "bundle")
SECTIONS = (
    ("General options", None),
    ("AAM pipeline options (the built-in model and data; a --task may read them)", AAM),
    ("Output options", OUTPUTS),
)

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
    for title, names in SECTIONS:
        if names is not None and param.name in names:
            return title
    return SECTIONS[0][0]


def format_grouped_options(command: click.Command, ctx: click.Context, formatter: click.HelpFormatter) -> None:
    """The options in SECTIONS' order, then the distributed notes and the task interface."""
    rows: dict[str, list[tuple[str, str]]] = {title: [] for title, _ in SECTIONS}
    for param in command.get_params(ctx):
        record = param.get_help_record(ctx)
        if record is not None:
            rows[section_of(param)].append(record)
    for title, _ in SECTIONS:
        if rows[title]:
            with formatter.section(title):
                formatter.write_dl(rows[title])
    for title, text in (("Distributed (torchrun)", DISTRIBUTED), ("Your own model: --task", TASK_INTERFACE)):
        with formatter.section(title):
            for line in text.splitlines():  # laid out already, within 80 columns
                formatter.write(" " * formatter.current_indent + line + "\n")
