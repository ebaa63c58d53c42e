"""The command line: `debug-nan [OPTIONS]` runs the job; `debug-nan replay BUNDLE` re-runs a saved finding.

Exit codes: 0 clean, 1 non-finite found (or the task's code failed), 2 bad usage, bad input or an output that
could not be written, 130 Ctrl-C, 143 SIGTERM, 129 a hang-up under torchrun (alone, a run goes on after
SIGHUP: process/streams.py) (an interrupt wins over a finding made before it: the report then
says status nonfinite, interrupted true). Every exit 2 leaves the error report where --report asked for one
(Click's own usage errors included), unless that path is an input or could not be read from the command line.
The only module that prints usage errors and ends the process: the library raises InputError and returns codes.
Everything that imports torch is imported inside the commands, so --help and usage errors answer at once.
"""

from __future__ import annotations

import os
import sys

import click

import debug_nan
from debug_nan import torch_support
from debug_nan.app import command as commands
from debug_nan.app import run_paths as paths
from debug_nan.app.cli_help import format_grouped_options
from debug_nan.app.cli_options import command_options, run_options
from debug_nan.app.job_settings import build_settings, load_config
from debug_nan.app.run_options import RunOptions
from debug_nan.errors import InputError
from debug_nan.presentation.log import error_line
from debug_nan.presentation.outputs import (
    OutputWriteError,
    check_output_paths,
    check_writable,
    job_inputs,
    job_outputs,
)
from debug_nan.process import interrupts, streams


def fail(message: str, report: str | None = None, inputs: dict[str, str] | None = None,
         outputs: dict[str, str] | None = None, code: int = 2) -> None:
    """Print a one-paragraph error on stderr, leave an error report where --report asked for one (unless that path
    is an input or another output, or its folder is not writable), and exit `code` (2: bad usage or input)."""
    click.echo(error_line(message), err=True)
    if report:
        write_error_report_safely(report, message, inputs or {}, outputs or {}, code)
    _exit(code)


def write_error_report_safely(report: str, message: str, inputs: dict[str, str], outputs: dict[str, str],
                              code: int = 2) -> None:
    from debug_nan.presentation.report import write_error_report

    _write_report_safely(report, inputs, outputs, lambda: write_error_report(report, message, code), "error report")


def write_interrupted_report_safely(report: str, exc: BaseException, inputs: dict[str, str],
                                    outputs: dict[str, str]) -> None:
    """The report of a run interrupted before its log opened (torch still importing, the outputs being checked):
    interrupted, nothing run, the signal's exit code. Without torch (it may be what was being imported)."""
    from debug_nan.presentation.report import write_interrupted_report

    name, code = interrupts.interrupt_name(exc), interrupts.interrupt_code(exc)
    note = f"Interrupted ({name}) before the run started: nothing was trained."
    _write_report_safely(report, inputs, outputs, lambda: write_interrupted_report(report, code, note), "report")


def _write_report_safely(report: str, inputs: dict[str, str], outputs: dict[str, str], write, what: str) -> None:
    """Write a report of a run that never got to write its own: only where --report may go (not onto an input
    or another output), and a failure to write it is a note, not a second error."""
    try:
        check_output_paths({"--report": report}, {**inputs, **{k: v for k, v in outputs.items() if k != "--report"}})
        check_writable(report, "--report")
        write()
    except InputError as exc:  # OutputWriteError included
        click.echo(f"debug-nan: note: no {what} written: {exc}", err=True)


def require_versions(installed: bool = False) -> None:
    """The Python and torch this run would use are in the supported range (torch_support.py): else one line and
    exit 2, before anything of debug-nan's that needs torch is imported (`installed`: torch's version read without
    importing it)."""
    try:
        torch_support.require(installed)
    except torch_support.UnsupportedVersion as exc:
        raise InputError(str(exc)) from None


def _exit(code: int) -> None:
    """Exit; under torchrun every rank leaves together (rank 0 has written the report by now)."""
    if "RANK" in os.environ:
        from debug_nan.engine.session import distributed

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
    from debug_nan.engine.session import distributed

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
    parse. Only debug-nan's own: after `--` the words are the user's command (`debug-nan run -- train.py --report
    R`), whose R is an input."""
    report, where, seen = None, None, False
    for k, arg in enumerate(args):
        if arg == "--":
            break
        if arg == "--report":
            seen = True
            if k + 1 < len(args) and not args[k + 1].startswith("-"):
                report, where = args[k + 1], k + 1
        elif arg.startswith("--report="):
            seen, report, where = True, arg.split("=", 1)[1] or None, k
    return report, where, seen


def _argv_paths(args: list[str], skip: int | None = None) -> dict[str, str]:
    """Every existing path named on the command line (but the word at index `skip`: --report's own value), as
    inputs that no output may overwrite: the options were not parsed, or belong to the user's command."""
    return {f"argument {a}": a for k, a in enumerate(args)
            if k != skip and not a.startswith("-") and os.path.lexists(a)}


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
        write_error_report_safely(report, message, {**job_inputs(_values(config, {}), config),
                                                    **_argv_paths(args, where)}, {})
    elif seen:
        click.echo("debug-nan: note: no error report written: the value of --report could not be read from the "
                   "command line.", err=True)
    _exit(2)


def interrupted_at_start(interrupt: BaseException | None, args: list[str]) -> None:
    """Ctrl-C or SIGTERM before a command began: one line, the interrupted report where --report asked for one
    (read from the raw arguments), the signal's exit code."""
    click.echo(f"debug-nan: interrupted ({interrupts.interrupt_name(interrupt)}).", err=True)
    report, where, _ = _report_in_argv(args)
    if report and _main_rank():
        write_interrupted_report_safely(report, interrupt, _argv_paths(args, where), {})
    sys.exit(interrupts.interrupt_code(interrupt))


class DebugNanGroup(click.Group):
    """Click's group, with SIGTERM handled like Ctrl-C and Click's own usage errors turned into exit 2 with the
    error report (Click's standalone mode would print them and exit without one)."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        args = list(sys.argv[1:] if args is None else args)
        try:  # (python -m debug_nan installed the signal handlers already: __main__.py)
            streams.install()  # a hung-up terminal, a broken pipe or a full disk never ends the run (fds 0-2)
            interrupts.install()  # inside: a signal right after it still gets its report
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.ClickException as exc:
            usage_error(exc, args)
        except (click.Abort, KeyboardInterrupt) as exc:  # Ctrl-C (or SIGTERM) while Click set up or parsed
            interrupted_at_start(exc if isinstance(exc, KeyboardInterrupt) else exc.__cause__ or exc.__context__,
                                 args)
        if not standalone_mode:
            return code
        sys.exit(code if isinstance(code, int) else 0)

    def format_options(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The options in groups (general, AAM pipeline, outputs), torchrun and the task interface, then the
        subcommands."""
        format_grouped_options(self, ctx, formatter)
        self.format_commands(ctx, formatter)


@click.group(cls=DebugNanGroup, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"],
                                                           "max_content_width": 100})
@click.version_option(debug_nan.__version__, "--version", prog_name="debug-nan", message="%(prog)s %(version)s")
@run_options
@click.pass_context
def main(ctx: click.Context, config, **flags):
    """Run a short training job with NaN/Inf checks on every layer, forward and backward, and pinpoint where
    the first non-finite value was born.

    \b
    Without --task it runs the built-in AAM-style pipeline on the BIOM table
    and tree in --data-dir (or synthetic data when there is none). Examples:
      debug-nan --token-limit 512 --max-steps 10 2>&1 | tee debug.log
      debug-nan --config configs/tiny.toml --no-guards --report report.json
      debug-nan --task my_task.py:build --max-steps 20
    """
    if ctx.invoked_subcommand is not None:
        return
    values, started = _values(config, flags), False
    try:
        with interrupts.deferred():  # torch: seconds, during which a SIGTERM waits for the import, then stops
            require_versions()
            from debug_nan.app.job import run_job
            from debug_nan.engine.session import distributed

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
@click.option("--trust", is_flag=True, help="Replay a bundle unsigned, changed or signed by a key you lack (loading "
              "it can run code stored in it: only one you trust). [default: refuse it, exit 2]")
def replay(bundle, device, report, log_path, trust):
    """Re-run the failing micro-batch saved in BUNDLE under the full op-level trace (any machine, CPU or GPU)."""
    try:
        with interrupts.deferred():
            require_versions()
            from debug_nan.app.replay import run_replay
        code = run_replay(bundle, device, report, log_path, trust)
    except OutputWriteError as exc:
        click.echo(error_line(str(exc)), err=True)
        code = 2
    except InputError as exc:
        fail(str(exc), report, {"bundle": bundle}, {"--log": log_path} if log_path else {})
    except KeyboardInterrupt as exc:  # (a replay that ran has written its own report by then)
        click.echo(f"debug-nan: interrupted ({interrupts.interrupt_name(exc)}).", err=True)
        if report and not os.path.exists(report):
            write_interrupted_report_safely(report, exc, {"bundle": bundle}, {"--log": log_path} if log_path else {})
        code = interrupts.interrupt_code(exc)
    sys.exit(code)


def _run_report(report: str | None) -> str | None:
    """Where `run`'s error or interrupted report may go: not over a file that is not debug-nan's (app/run_paths.py:
    the command's own, or one it wrote while it ran)."""
    if report and os.path.isfile(report) and not paths.replaceable(report, "--report"):
        click.echo(f"debug-nan: note: no report written: {report} is a file debug-nan did not write.", err=True)
        return None
    return report


@main.command("run", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@command_options
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
def run(report, log_path, max_steps, explosion_threshold, explosion_growth, bundle_dir, bundle, trace_at,
        deterministic, plot, tensorboard, history, command):
    """Run your own training command, unmodified, watched: debug-nan run [OPTIONS] -- python train.py ARGS.

    \b
    COMMAND: `python train.py ARGS`, `python -m package.module ARGS`, `train.py ARGS` or an installed console
    script. It runs in this process (its sys.argv, __main__, working directory and exit code as usual); the
    watch attaches to the optimizer it creates and the model that owns its parameters. On the first NaN/Inf the
    failing micro-batch is replayed in place under the op-level tracer, from the run's own state, and the command
    is stopped (exit 1). A clean run exits with the command's own code. --checkpoint / --skip-batches do not apply: use
    your script's own. Under torchrun (a DDP script): torchrun --nproc_per_node=N -m debug_nan run [OPTIONS] -- train.py
    ARGS; the ranks agree on every trip, each replays its own micro-batch, and they stop together."""
    report, log_path, plot = paths.absolute(report), paths.absolute(log_path), paths.absolute(plot)  # it may chdir
    tensorboard = paths.absolute(tensorboard)
    bundle_dir = paths.absolute(bundle_dir or (os.path.dirname(report) if report else ".")) if bundle else None
    inputs = _argv_paths(list(command))  # the script and its files: never written over by our outputs
    try:
        options = RunOptions(report, log_path, max_steps, explosion_threshold, explosion_growth, deterministic,
                             bundle_dir, trace_at=trace_at, plot=plot, tensorboard=tensorboard, history=history,
                             command=list(command))
        check_output_paths({"--report": report, "--log": log_path, "--plot": plot}, inputs, bundle_dir)
        paths.refuse_foreign({"--report": report, "--log": log_path, "--plot": plot})
        target = commands.resolve(list(command))
        if target.kind == "program":  # this process only starts it and reads its ranks' results: no torch here
            require_versions(installed=True)
            from debug_nan.app.run_program import run_program

            code = run_program(target, options)
        else:  # a Python command: it runs in this process (app/run_job.py)
            with interrupts.deferred():
                require_versions()
                from debug_nan.app.run_job import run_command
            code = run_command(target, options)
    except OutputWriteError as exc:
        click.echo(error_line(str(exc)), err=True)
        code = 2
    except InputError as exc:  # (CommandRaised: the script's own error before it trained, exit 1 as plain Python)
        fail(str(exc), _run_report(report), inputs, {"--log": log_path} if log_path else {}, exc.exit_code)
    except KeyboardInterrupt as exc:  # before the command trained (the job writes its own report after)
        click.echo(f"debug-nan: interrupted ({interrupts.interrupt_name(exc)}).", err=True)
        if _run_report(report) and _main_rank():
            write_interrupted_report_safely(report, exc, inputs, {"--log": log_path} if log_path else {})
        code = interrupts.interrupt_code(exc)
    sys.exit(code)


if __name__ == "__main__":  # pragma: no cover
    main()
