"""The command line: `debug-nan [OPTIONS]` runs the job; `debug-nan replay BUNDLE` re-runs a saved finding.

Exit codes: 0 clean, 1 non-finite found (or the task's code failed), 2 bad usage or bad input, 130 Ctrl-C.
The only module that prints usage errors and ends the process: the library raises InputError and returns codes.
Everything that imports torch is imported inside the commands, so --help and usage errors answer at once.
"""

from __future__ import annotations

import sys

import click

from debug_nan.errors import InputError
from debug_nan.report.log import error_line
from debug_nan.settings import CHOICES, RunSettings, build_settings

DEFAULTS = RunSettings()


def _opt(*decls, help: str, **kw):
    """A click option whose default is None (so explicit flags can override the config file); the help text
    shows the real default."""
    name = decls[0].lstrip("-").split("/")[0].replace("-", "_")
    default = getattr(DEFAULTS, name, None)
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
    _opt("--asv-chunk-size", type=int, help="Encode ASVs in chunks of this many (checkpointed) to bound memory."),
    _opt("--task", type=str, help="Debug your own model: FILE.py:NAME or package.module:NAME."),
    _opt("--trace-every-step/--no-trace-every-step", help="Print the full layer-by-layer trace every step."),
    _opt("--keep-going/--stop-at-first", help="Record a finding and go on (skipping that step's update) instead "
                                              "of stopping. [default: stop]"),
    _opt("--explosion-threshold", type=float, help="Gradient norm that counts as an explosion (with growth)."),
    _opt("--explosion-growth", type=float, help="...and growth over the smallest earlier norm."),
    _opt("--snapshot", type=click.Choice(CHOICES["snapshot"]), help="Where the copy of the state before each "
         "step (for the replay) lives: host (pinned CPU memory, copied asynchronously: no GPU memory), device "
         "(GPU memory), or off (no copy: a trip is reported without replaying the op). On a CPU run host and "
         "device are the same."),
    _opt("--report", type=click.Path(dir_okay=False), help="Write the JSON report here."),
    _opt("--bundle-dir", type=click.Path(file_okay=False), help="Where a finding writes its repro bundle "
                                                                 "[default: the report's folder, else .]"),
    _opt("--bundle/--no-bundle", help="Write a repro bundle on a finding. [default: bundle]"),
    _opt("--log", type=click.Path(dir_okay=False), help="Write a copy of the text log here."),
    _opt("--plot", type=click.Path(dir_okay=False), help="Heat map of the per-layer history (PNG; needs "
                                                         "matplotlib)."),
]


def run_options(fn):
    for option in reversed(RUN_OPTIONS):
        fn = option(fn)
    return fn


def fail(message: str, report: str | None = None) -> None:
    """Print a one-paragraph error on stderr, leave an error report where --report asked for one (when its
    folder is writable), and exit 2."""
    click.echo(error_line(message), err=True)
    if report:
        from debug_nan.report.summary import check_writable, write_error_report

        try:
            check_writable(report, "--report")
            write_error_report(report, message, 2)
        except (InputError, OSError):
            pass
    sys.exit(2)


def _main_rank() -> bool:
    """Under torchrun only rank 0 writes the report (a malformed environment counts as a single process)."""
    from debug_nan.train import distributed

    try:
        ctx = distributed.detect()
    except InputError:
        return True
    return ctx is None or ctx.is_main


@click.group(invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"],
                                                           "max_content_width": 110})
@run_options
@click.pass_context
def main(ctx: click.Context, config, **flags):
    """Run a short training job with NaN/Inf checks on every layer, forward and backward, and pinpoint where
    the first non-finite value was born.

    \b
    Without --task it runs the built-in AAM-style pipeline on the BIOM table + tree in --data-dir (or
    synthetic data when there is none). Examples:
      debug-nan --token-limit 512 --max-steps 10 2>&1 | tee debug.log
      debug-nan --config configs/tiny.toml --no-guards --report report.json
      debug-nan --task my_task.py:build --max-steps 20
    """
    if ctx.invoked_subcommand is not None:
        return
    from debug_nan.runner import run_job
    from debug_nan.train import distributed

    report = flags.get("report")
    try:
        settings = build_settings(config, flags)
        report = settings.report
        code = run_job(settings)
    except InputError as exc:
        fail(str(exc), report if _main_rank() else None)
    except KeyboardInterrupt:  # Ctrl-C outside the training loop (which writes its own partial summary)
        click.echo("debug-nan: interrupted (Ctrl-C).", err=True)
        sys.exit(130)
    if distributed.detect() is not None:
        distributed.leave_together(code)  # every rank leaves with its own code once all are done
    sys.exit(code)


@main.command("replay")
@click.argument("bundle", type=click.Path(dir_okay=False))
@click.option("--device", default="auto", help="auto, cpu, cuda or cuda:N [default: auto]")
@click.option("--report", type=click.Path(dir_okay=False), default=None, help="Write the JSON report here.")
@click.option("--log", "log_path", type=click.Path(dir_okay=False), default=None, help="A copy of the text log.")
def replay(bundle, device, report, log_path):
    """Re-run the failing micro-batch saved in BUNDLE under the full op-level trace (any machine, CPU or GPU)."""
    from debug_nan.replay import run_replay

    try:
        code = run_replay(bundle, device, report, log_path)
    except InputError as exc:
        fail(str(exc), report)
    except KeyboardInterrupt:
        click.echo("debug-nan: interrupted (Ctrl-C).", err=True)
        code = 130
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
