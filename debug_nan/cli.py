"""The command line: `debug-nan [OPTIONS]` runs the job; `debug-nan replay BUNDLE` re-runs a saved finding.

Exit codes: 0 clean, 1 non-finite found (or the task's code failed), 2 bad usage, bad input or an output that
could not be written, 130 Ctrl-C, 143 SIGTERM, 129 a hang-up under torchrun (alone, a run goes on after
SIGHUP: report/streams.py) (an interrupt wins over a finding made before it: the report then
says status nonfinite, interrupted true). Every exit 2 leaves the error report where --report asked for one
(Click's own usage errors included), unless that path is an input or could not be read from the command line.
The only module that prints usage errors and ends the process: the library raises InputError and returns codes.
Everything that imports torch is imported inside the commands, so --help and usage errors answer at once.
"""

from __future__ import annotations

import json
import os
import sys

import click

from debug_nan import __version__
from debug_nan.errors import InputError
from debug_nan.report import interrupts, streams
from debug_nan.report.log import error_line
from debug_nan.report.outputs import (OutputWriteError, check_output_paths, check_writable, job_inputs,
                                        job_outputs, write_text_atomic)
from debug_nan.settings import CHOICES, RunSettings, build_settings, load_config

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


def fail(message: str, report: str | None = None, inputs: dict[str, str] | None = None,
         outputs: dict[str, str] | None = None) -> None:
    """Print a one-paragraph error on stderr, leave an error report where --report asked for one (unless that path
    is an input or another output, or its folder is not writable), and exit 2."""
    click.echo(error_line(message), err=True)
    if report:
        write_error_report_safely(report, message, inputs or {}, outputs or {})
    _exit(2)


def write_error_report_safely(report: str, message: str, inputs: dict[str, str], outputs: dict[str, str]) -> None:
    from debug_nan.report.summary import write_error_report

    try:
        check_output_paths({"--report": report}, {**inputs, **{k: v for k, v in outputs.items() if k != "--report"}})
        check_writable(report, "--report")
        write_error_report(report, message, 2)
    except InputError as exc:  # OutputWriteError included
        click.echo(f"debug-nan: note: no error report written: {exc}", err=True)


def write_interrupted_report_safely(report: str, exc: BaseException, inputs: dict[str, str],
                                    outputs: dict[str, str]) -> None:
    """The report of a run interrupted before its log opened (torch still importing, the outputs being checked):
    interrupted, nothing run, the signal's exit code. Without torch (it may be what was being imported)."""
    name, code = interrupts.interrupt_name(exc), interrupts.interrupt_code(exc)
    data = {"status": "clean", "interrupted": True, "steps_run": 0, "first_nonfinite": None, "findings": [],
            "exit_code": code, "notes": [f"Interrupted ({name}) before the run started: nothing was trained."],
            "debug_nan": __version__}
    try:
        check_output_paths({"--report": report}, {**inputs, **{k: v for k, v in outputs.items() if k != "--report"}})
        check_writable(report, "--report")
        write_text_atomic(report, json.dumps(data, indent=2) + "\n", "--report")
    except InputError as exc2:  # OutputWriteError included
        click.echo(f"debug-nan: note: no report written: {exc2}", err=True)


def _exit(code: int) -> None:
    """Exit; under torchrun every rank leaves together (rank 0 has written the report by now)."""
    if "RANK" in os.environ:
        from debug_nan.train import distributed

        try:
            if distributed.detect() is not None and distributed.dist.is_initialized():
                distributed.leave_together(code)
        except InputError:
            pass
    sys.exit(code)


def _main_rank() -> bool:
    """Under torchrun only rank 0 writes the report (a malformed environment counts as a single process)."""
    if "RANK" not in os.environ:
        return True
    from debug_nan.train import distributed

    try:
        ctx = distributed.detect()
    except InputError:
        return True
    return ctx is None or ctx.is_main


def _values(config: str | None, flags: dict) -> dict:
    """The settings as far as they can be read (the config file, then the flags), for the error report's path
    and the inputs it must not overwrite when the settings themselves are the error."""
    values = {}
    if config:
        try:
            values.update(load_config(config))
        except InputError:
            pass
    values.update({k: v for k, v in flags.items() if v is not None})
    return values


def _report_in_argv(args: list[str]) -> tuple[str | None, int | None, bool]:
    """(--report's value, its index in args, whether --report appeared at all) from raw arguments Click could not
    parse."""
    report, where, seen = None, None, False
    for k, arg in enumerate(args):
        if arg == "--report":
            seen = True
            if k + 1 < len(args) and not args[k + 1].startswith("-"):
                report, where = args[k + 1], k + 1
        elif arg.startswith("--report="):
            seen, report, where = True, arg.split("=", 1)[1] or None, k
    return report, where, seen


def usage_error(exc: click.ClickException, args: list[str]) -> None:
    """Click could not parse the command line: the usage, one error line, the error report, exit 2. Every path on
    the command line counts as an input the report must not overwrite (the options were not parsed)."""
    ctx = getattr(exc, "ctx", None)
    if ctx is not None:
        click.echo(ctx.get_usage(), err=True)
        click.echo(f"Try '{ctx.command_path} -h' for help.", err=True)
    message = exc.format_message()
    click.echo(error_line(message), err=True)
    report, where, seen = _report_in_argv(args)
    if report and _main_rank():
        config = next((args[k + 1] for k, a in enumerate(args[:-1]) if a == "--config"), None)
        named = {f"argument {a}": a for k, a in enumerate(args)
                 if k != where and not a.startswith("-") and os.path.lexists(a)}
        write_error_report_safely(report, message, {**job_inputs(_values(config, {}), config), **named}, {})
    elif seen:
        click.echo("debug-nan: note: no error report written: the value of --report could not be read from the "
                   "command line.", err=True)
    _exit(2)


class DebugNanGroup(click.Group):
    """Click's group, with SIGTERM handled like Ctrl-C and Click's own usage errors turned into exit 2 with the
    error report (Click's standalone mode would print them and exit without one)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        args = list(sys.argv[1:] if args is None else args)
        streams.install()  # a hung-up terminal, a broken pipe or a full disk never ends the run (first: fds 0-2)
        try:
            interrupts.install()  # inside: a signal right after it still gets its report
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:
            usage_error(exc, args)
        except (click.Abort, KeyboardInterrupt) as exc:  # Ctrl-C (or SIGTERM) while Click set up or parsed
            interrupt = exc if isinstance(exc, KeyboardInterrupt) else exc.__cause__ or exc.__context__
            click.echo(f"debug-nan: interrupted ({interrupts.interrupt_name(interrupt)}).", err=True)
            report = _report_in_argv(args)[0]
            if report and _main_rank():
                named = {f"argument {a}": a for a in args
                         if a != report and not a.startswith("-") and os.path.lexists(a)}
                write_interrupted_report_safely(report, interrupt, named, {})
            sys.exit(interrupts.interrupt_code(interrupt))
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)


@click.group(cls=DebugNanGroup, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"],
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
    values, started = _values(config, flags), False
    try:
        from debug_nan.runner import run_job  # torch: seconds, during which a SIGTERM still gets its report
        from debug_nan.train import distributed

        settings = build_settings(config, flags)
        values, started = settings.to_dict(), True
        code = run_job(settings, config=config)
    except OutputWriteError as exc:  # the run ended; its summary is printed and its other outputs written
        click.echo(error_line(str(exc)), err=True)
        _exit(2)
    except InputError as exc:
        fail(str(exc), values.get("report") if _main_rank() else None, job_inputs(values, config), job_outputs(values))
    except KeyboardInterrupt as exc:  # Ctrl-C / SIGTERM outside the training loop (which writes its own summary)
        click.echo(f"debug-nan: interrupted ({interrupts.interrupt_name(exc)}).", err=True)
        if (not started or getattr(exc, "before_log", False)) and values.get("report") and _main_rank():
            write_interrupted_report_safely(values["report"], exc, job_inputs(values, config), job_outputs(values))
        sys.exit(interrupts.interrupt_code(exc))
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
    except OutputWriteError as exc:
        click.echo(error_line(str(exc)), err=True)
        code = 2
    except InputError as exc:
        fail(str(exc), report, {"bundle": bundle}, {"--log": log_path} if log_path else {})
    except KeyboardInterrupt as exc:
        click.echo(f"debug-nan: interrupted ({interrupts.interrupt_name(exc)}).", err=True)
        code = interrupts.interrupt_code(exc)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
