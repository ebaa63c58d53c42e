"""The last block of the log: the summary that pinpoints the first origin (the JSON report: report.py)."""

from __future__ import annotations

import textwrap

from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.stats_record import TensorStats
from debug_nan.engine.vocabulary import Cause, Phase
from debug_nan.engine.watch.quiet import quiet_warnings, scaler_skips

EXIT_CODES = {"clean": 0, "nonfinite": 1, "error": 1}


def _wrap(label: str, text: str, width: int = 100) -> list[str]:
    lines = textwrap.wrap(text, width=width - 16, break_on_hyphens=False) or [""]  # keep --options whole
    return [f"  {label:<13}{lines[0]}"] + [f"  {'':<13}{line}" for line in lines[1:]]


def finding_lines(f: Finding) -> list[str]:
    lines = []
    # an eval finding: its batch (a forward outside training, for `run`) counted from the last step before it
    at = f"after step {f.step}, eval batch" if f.phase == Phase.EVAL else f"step {f.step}, micro-batch"
    lines += _wrap("where", f"{at} {f.micro_step}, phase {f.phase}"
                   + (f", rank {f.rank} (first to see it: rank(s) {', '.join(map(str, f.first_ranks))})"
                      if f.rank is not None else ""))
    if f.phase == Phase.BACKWARD and not f.module and not f.module_type:
        lines += _wrap("module", "none (the backward of the loss code, outside the model)")
    elif f.phase not in ("data", "loss"):
        lines += _wrap("module", f"{f.module or '<model root>'}" + (f" ({f.module_type})" if f.module_type else ""))
    elif f.phase == Phase.LOSS:
        lines += _wrap("module", "none (the loss code, outside the model)")
    if f.op:
        lines += _wrap("operation", f"{f.op} -> first {f.kind.upper()}"
                       + (f" (in backward node {f.backward_node})" if f.backward_node else ""))
    if f.source:
        lines += _wrap("source", f.source + (f"   {f.source_line}" if f.source_line else ""))
    if f.inside:  # the installed library's line where the op itself ran, under the user's line above
        lines += _wrap("inside", f.inside + (f"   {f.inside_line}" if f.inside_line else ""))
    lines += _wrap("cause", f.cause)
    if f.reproducible is False:
        lines += _wrap("reproducible", "no: two replays of the run's own state and batch stayed finite")
    lines += _wrap("evidence", f.explanation)
    for name, stats in f.inputs.items():
        lines += _wrap(f"in {name}"[:12], TensorStats(**stats).line())
    for name, stats in f.outputs.items():
        lines += _wrap(name[:12], TensorStats(**stats).line())
    if f.sample_ids:
        lines += _wrap("samples", ", ".join(f.sample_ids))
    if f.exception:
        lines += _wrap("exception", f.exception)
    if f.watch:
        how = "; the op-level replay found the origin above" if f.detected_by == "replay" else \
            f" (detected by the {f.detected_by})"
        lines += _wrap("watch saw", f"{f.watch}{how}")
    for note in f.notes:
        lines += _wrap("note", note)
    if f.bundle:
        lines += _wrap("repro", f"debug-nan replay {f.bundle}")
    lines.append("  try:")
    for i, tip in enumerate(f.suggestions, 1):
        wrapped = textwrap.wrap(tip, width=92, break_on_hyphens=False)
        lines.append(f"    {i}. {wrapped[0]}")
        lines += [f"       {w}" for w in wrapped[1:]]
    return lines


def exit_code(result) -> int:
    """The process exit code of a result: an explicit one (an interrupt: 130 or 143; an abort under DDP; an output
    that could not be written: 2), else the status's."""
    if result.exit_code is not None:
        return result.exit_code
    return 130 if result.interrupted else EXIT_CODES[result.status]


def seconds(elapsed: float) -> str:
    """"12.3 s", or two significant digits under a second ("0.043 s": a short run does not read as "0.0 s")."""
    return f"{elapsed:.1f} s" if elapsed >= 0.95 else f"{elapsed:.2g} s"


def write_summary(log, result, elapsed: float, interrupted_by: str = "Ctrl-C", exits: bool = True) -> None:
    """The SUMMARY block. `exits`: this process ends with the result's exit code (the CLI); a framework callback
    passes False, since the process's code is then the framework's, and no code is printed."""
    log()
    log.rule("SUMMARY")
    code = f", exit {exit_code(result)}" if exits else ""
    paren = f" (exit {exit_code(result)})" if exits else ""
    if result.interrupted:
        log(f"  interrupted after {result.steps_run} step(s) ({interrupted_by}{code}); what ran until then:")
    if result.status == "clean":
        log(f"  status       CLEAN: {result.steps_run} step(s), {seconds(elapsed)}; the loss, every gradient and every "
            f"parameter finite", "green")
    elif result.status == "error":
        log(f"  status       ERROR after {result.steps_run} step(s){paren}", "red")
        for line in _wrap("error", result.error or ""):
            log(line)
    else:
        f = result.finding
        if f.cause == Cause.GRADIENT_EXPLOSION:
            log(f"  status       NONFINITE AHEAD: a gradient explosion, caught before it overflowed{paren}", "red")
        else:
            log(f"  status       NONFINITE: the first {f.kind.upper()} was born here{paren}", "red")
        for line in finding_lines(f):
            log(line)
        if len(result.findings) > 1:
            log(f"  ({len(result.findings) - 1} later finding(s) in the JSON report)")
    if (skips := scaler_skips(result.history)) is not None:
        log(f"  skipped      {skips}")
    for warning in quiet_warnings(result.history):  # finite, yet not training (or about to overflow)
        for line in _wrap("warning", warning):
            log(line, "yellow")
    for note in result.notes:
        for line in _wrap("note", note):
            log(line)
    log.rule()
