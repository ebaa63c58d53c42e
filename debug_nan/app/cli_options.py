"""The command-line options of the job (`debug-nan [OPTIONS]`) and of `debug-nan run`, each with its default and
choices from the settings' components (app/job_settings.py LAYOUT; `run`'s from the watch's and the outputs'). The
job's defaults are None in Click so that explicit flags can override the TOML config; grouped for --help by the
component each setting belongs to (app/cli_help.py)."""

from __future__ import annotations

import click

from debug_nan.app.job_settings import LAYOUT
from debug_nan.settings import OutputSettings, WatchSettings

CHOICES = {name: place.choices for name, place in LAYOUT.places.items() if place.choices}


def _opt(*decls, help: str, **kw):
    """A click option whose default is None (so explicit flags can override the config file); the help text
    shows the real default."""
    name = decls[0].lstrip("-").split("/")[0].replace("-", "_")
    default = LAYOUT.default(name)
    shown = f" [default: {default}]" if default is not None and "is_flag" not in kw and "/" not in decls[0] else ""
    return click.option(*decls, default=None, help=help + shown, **kw)


RUN_OPTIONS = [
    click.option("--config", "config", type=click.Path(dir_okay=False), default=None,
                 help="TOML job config (see configs/); explicit flags override it."),
    _opt("--token-limit", type=int, help="ASV slots per sample (at most this many ASVs are kept)."),
    _opt("--batch-size", type=int, help="Samples per micro-batch (even: UniFrac needs pairs)."),
    _opt("--gradient-accumulation-steps", type=int, help="Micro-batches per optimizer step."),
    _opt("--data-dir", type=click.Path(file_okay=False), help="Folder with one *.biom and one Newick tree."),
    _opt("--table", type=click.Path(dir_okay=False), help="BIOM table (HDF5 or JSON); overrides --data-dir."),
    _opt("--tree", type=click.Path(dir_okay=False), help="Newick tree whose tips are the table's ASV IDs."),
    _opt("--sequences", type=click.Path(dir_okay=False), help="FASTA mapping hashed ASV IDs to DNA."),
    _opt("--device", type=str, help="auto, cpu, cuda or cuda:N."),
    _opt("--max-steps", type=int, help="Optimizer steps to run."),
    _opt("--seed", type=int, help="Seed for data order, synthetic data, init and dropout."),
    _opt("--lr", type=float, help="Peak learning rate of the default optimizer, AdamW (a task's own optimizer "
                                  "keeps its own)."),
    _opt("--weight-decay", type=float, help="AdamW weight decay (the default optimizer)."),
    _opt("--warmup-steps", type=int, help="Linear warmup over this many steps, replacing the task's own schedule "
                                          "[default: the task's own; the built-in pipeline warms up over 2]."),
    _opt("--precision", type=click.Choice(CHOICES["precision"]), help="fp32, or autocast bf16/fp16 (fp16 with a "
                                                                       "gradient scaler)."),
    _opt("--max-grad-norm", type=float, help="Clip the total gradient norm to this, replacing the task's own "
                                             "clipping; 0 disables [default: the task's own; the built-in "
                                             "pipeline clips at 1.0, a --task only if it sets max_grad_norm]."),
    _opt("--guards/--no-guards", help="Padding guards in the built-in model; --no-guards reproduces the "
                                      "pre-fix NaN. [default: guards]"),
    _opt("--asv-encoder", type=click.Choice(CHOICES["asv_encoder"]),
         help="The ASV encoder's transformer: builtin, or torch (nn.TransformerEncoder, whose inference fast path "
              "under eval() + no_grad reproduces PYT-8.9 with --no-guards --eval-every N)."),
    _opt("--asv-order", type=click.Choice(CHOICES["asv_order"]), help="Which ASVs a truncated sample keeps."),
    _opt("--rarefy-depth", type=int, help="Rarefy every sample to this many reads first."),
    _opt("--unifrac", type=click.Choice(CHOICES["unifrac"]), help="UniFrac metric (weighted = normalized)."),
    _opt("--synthetic-samples", type=int, help="Samples to synthesize when no data is found."),
    _opt("--d-model", type=int, help="Model width."),
    _opt("--heads", type=int, help="Attention heads."),
    _opt("--asv-layers", type=int, help="Transformer layers over the nucleotides of an ASV."),
    _opt("--sample-layers", type=int, help="Transformer layers over the ASVs of a sample."),
    _opt("--encoder-layers", type=int, help="Encoder layers before pooling to a sample vector."),
    _opt("--dropout", type=float, help="Dropout."),
    _opt("--ffn-mult", type=int, help="Feed-forward width as a multiple of --d-model."),
    _opt("--nuc-weight", type=float, help="Weight of the nucleotide (masked-token) loss of the built-in pipeline."),
    _opt("--unifrac-weight", type=float, help="Weight of the UniFrac distance loss of the built-in pipeline."),
    _opt("--asv-chunk-size", type=int, help="Encode ASVs in chunks of this many (checkpointed) to bound memory."),
    _opt("--task", type=str, help="Debug your own model: FILE.py:NAME or package.module:NAME."),
    _opt("--checkpoint", type=click.Path(dir_okay=False), help="Start from this checkpoint: model, and where "
         "present optimizer, scheduler, scaler and step counter; steps continue from its step."),
    _opt("--checkpoint-non-strict/--checkpoint-strict", help="Load only the checkpoint keys that fit the model "
         "(and name the rest) instead of exit 2. [default: strict]"),
    _opt("--checkpoint-unsafe-load/--checkpoint-weights-only", help="torch.load the checkpoint with "
         "weights_only=False (runs code stored in it: only for files you trust). [default: weights only]"),
    _opt("--skip-batches", type=int, help="Fast-forward past this many micro-batches (without training) before "
                                          "the first step, to reach the batch a resumed run failed on."),
    _opt("--eval-every", type=int, help="An eval pass (model.eval(), no_grad) on held-out batches every N "
                                        "optimizer steps, and one at the end. [default: none]"),
    _opt("--eval-batches", type=int, help="Held-out batches per eval pass [default: all]."),
    _opt("--eval-samples", type=int, help="Built-in pipeline: samples held out for the eval pass [default: 1/8, "
                                          "at least one batch]."),
    _opt("--fsdp/--ddp", help="Under torchrun: shard the model with FSDP2 (fully_shard on every block of a "
         "ModuleList and on the root) instead of wrapping it in DDP. [default: ddp]"),
    _opt("--trace-every-step/--no-trace-every-step", help="Print the full layer-by-layer trace every step."),
    _opt("--keep-going/--stop-at-first", help="Record a finding and go on (skipping that step's update) instead "
                                              "of stopping. [default: stop]"),
    _opt("--explosion-threshold", type=float, help="Gradient norm that counts as an explosion (with growth)."),
    _opt("--explosion-growth", type=float, help="...and growth over the smallest earlier norm."),
    _opt("--snapshot", type=click.Choice(CHOICES["snapshot"]), help="Where the copy of the state before each "
         "step (for the replay) lives: host (pinned CPU memory, copied asynchronously: no GPU memory), device "
         "(GPU memory), params (as host, without the optimizer state: an optimizer-phase trip is reported without "
         "its op), or off (no copy: a trip is reported without replaying the op). On a CPU run host and device "
         "are the same."),
    _opt("--snapshot-every", type=int, help="Copy the state every N steps (an optimizer-phase trip re-runs the "
         "steps since the copy, checked against the watch's reading of the run's state; other trips copy the live "
         "state). [default: 0 = every step on "
         "CUDA, where the copy overlaps the step; on the CPU as often as costs at most 0.5% of a step]"),
    _opt("--outputs-every", type=int, help="Measure the module outputs (max |x| per layer for the history, the "
         "notes on -inf masks; they never trip) every N steps. [default: 0 = every step on CUDA and for the first "
         "16 steps; after them, on the CPU, as often as costs at most 0.5% of a step]"),
    _opt("--report", type=click.Path(dir_okay=False), help="Write the JSON report here."),
    _opt("--bundle-dir", type=click.Path(file_okay=False), help="Where a finding writes its repro bundle "
                                                                 "[default: the report's folder, else .]"),
    _opt("--bundle/--no-bundle", help="Write a repro bundle on a finding. [default: bundle]"),
    _opt("--log", type=click.Path(dir_okay=False), help="Write a copy of the text log here."),
    _opt("--plot", type=click.Path(dir_okay=False), help="Heat map of the per-layer history (PNG; needs "
                                                         "matplotlib)."),
    _opt("--history", type=click.Choice(CHOICES["history"]), help="The per-layer history before the summary: "
         "compact (one screen: deep models grouped by block) or full (every module with parameters)."),
    _opt("--quiet/--no-quiet", help="Print only the header, one line per step and the summary."),
    _opt("--tensorboard", type=click.Path(file_okay=False), help="Write the history (loss, lr, loss scale, per-layer "
         "max |activation| and gradient norm) as TensorBoard scalars and the finding as text into this folder at "
         "the end of the run (needs tensorboard)."),
]


def run_options(fn):
    for option in reversed(RUN_OPTIONS):
        fn = option(fn)
    return fn




def _step_micro(value: str | None) -> tuple[int, int] | None:
    """--trace-at STEP[:MICRO] -> (step, micro), both from 1."""
    if value is None:
        return None
    step, _, micro = value.partition(":")
    try:
        where = int(step), int(micro or 1)
    except ValueError:
        where = (0, 0)
    if min(where) < 1:
        raise click.BadParameter(f"{value!r}: give the step and micro-batch the log named, e.g. 3:1 (both from 1).")
    return where


# `debug-nan run [OPTIONS] -- COMMAND`'s options: the job's outputs and checks that apply to a command of the user's
# (no AAM, no training knob: the script's own), each with its default shown
COMMAND_OPTIONS = [
    click.option("--report", type=click.Path(dir_okay=False), default=None, help="Write the JSON report here."),
    click.option("--log", "--log-file", "log_path", type=click.Path(dir_okay=False), default=None,
                 help="A copy of debug-nan's lines (which go to stderr: the command's stdout stays its own). Under "
                      "torchrun write --log-file: torchrun's own parser takes --log for its --log-dir."),
    click.option("--max-steps", type=click.IntRange(min=1), default=None,
                 help="Stop the command after this many optimizer steps, with a clean summary."),
    click.option("--explosion-threshold", type=float, default=WatchSettings.explosion_threshold, show_default=True,
                 help="Gradient norm that counts as an explosion (with growth)."),
    click.option("--explosion-growth", type=float, default=WatchSettings.explosion_growth, show_default=True,
                 help="...and growth over the smallest earlier norm."),
    click.option("--bundle-dir", type=click.Path(file_okay=False), default=None,
                 help="Where a finding writes its repro bundle (the script's model, optimizer and the recorded code "
                      "around the model, for debug-nan replay) [default: the report's folder, else .]."),
    click.option("--bundle/--no-bundle", default=True, help="Write a repro bundle on a finding. [default: bundle]"),
    click.option("--trace-at", metavar="STEP[:MICRO]", callback=lambda ctx, param, value: _step_micro(value),
                 help="Trace that micro-batch (default 1) of that optimizer step as it runs, and explain it at its "
                      "trip instead of replaying it: for a micro-batch the log said could not be replayed in place. "
                      "The command runs again up to there (its files are written again); the NaN must come back."),
    click.option("--deterministic", is_flag=True,
                 help="torch.use_deterministic_algorithms(True) in the command (changes its kernels: the pinpoint "
                      "does not need it, it replays from the run's own state)."),
    click.option("--plot", type=click.Path(dir_okay=False), default=None,
                 help="Heat map of the per-layer history (PNG; needs matplotlib)."),
    click.option("--tensorboard", type=click.Path(file_okay=False), default=None,
                 help="Write the history (loss, lr, loss scale, per-layer max |activation| and gradient norm) as "
                      "TensorBoard scalars and the finding as text into this folder at the end of the run (needs "
                      "tensorboard)."),
    click.option("--history", type=click.Choice(CHOICES["history"]), default=OutputSettings.history, show_default=True,
                 help="The per-layer history before the summary: compact (one screen: deep models grouped by "
                      "block) or full (every module with parameters)."),
]


def command_options(fn):
    for option in reversed(COMMAND_OPTIONS):
        fn = option(fn)
    return fn
