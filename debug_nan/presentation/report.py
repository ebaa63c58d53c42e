"""The JSON report (--report, docs/report.md): one layout, with its `schema_version`, for every entry point (the
job, `debug-nan run`, `debug-nan replay`, the Lightning and HF callbacks), built by `build_report` alone; strict
JSON, written atomically.

No torch here: the cli writes the report of a run stopped before torch loaded (a usage error, an interrupt). The
torch version is the one this process has loaded, if any.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field

import debug_nan
from debug_nan.engine.watch.quiet import quiet_warnings
from debug_nan.presentation.outputs import write_text_atomic

SCHEMA_VERSION = 1  # raised when a key is removed or changes meaning (new keys do not raise it)


@dataclass
class NotRun:
    """The result of a run that never trained: stopped by bad usage or input (status error), or interrupted
    before it began. A RunResult with nothing run (no history, no recipe)."""

    status: str
    error: str | None = None
    interrupted: bool = False
    notes: list[str] = field(default_factory=list)
    steps_run: int = 0
    findings: list = field(default_factory=list)
    history = None
    recipe = None


def build_report(result, *, exit_code: int | None, settings: dict | None = None, device=None,
                 elapsed: float | None = None, **extra) -> dict:
    """The report of `result` (a RunResult, or NotRun). `exit_code`: the process's code (None where a framework
    decides it: the callbacks). `settings`: the settings this entry point ran with, its own options and what it
    read from the framework or the script (None: it never got to them). `extra`: the entry point's own blocks
    (`integration`, `replay_of`)."""
    history = result.history
    findings = [f.to_dict() for f in result.findings]
    torch = sys.modules.get("torch")
    return {
        "schema_version": SCHEMA_VERSION,
        "status": result.status,
        "steps_run": result.steps_run,
        "first_nonfinite": findings[0] if findings else None,
        "findings": findings,
        "error": result.error,
        "interrupted": result.interrupted,
        "exit_code": exit_code,
        "elapsed_s": round(elapsed, 3) if elapsed is not None else None,
        "device": str(device) if device is not None else None,
        "torch": getattr(torch, "__version__", None),
        "debug_nan": debug_nan.__version__,
        "settings": settings,
        "history": history.to_dict() if history is not None else [],
        "history_kept": history.kept() if history is not None else None,  # bounded on long runs (per-layer series)
        "notes": list(result.notes),
        "warnings": quiet_warnings(history) if history is not None else [],
        "recipe": result.recipe,
        **extra,
    }


def _json_safe(obj):
    """Strict JSON: non-finite floats become the strings "nan", "inf", "-inf"; unknown objects their str()."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else ("nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf"))
    if isinstance(obj, dict):
        return {str(k): _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


def write_report(path: str, data: dict) -> None:
    """Strict JSON, written atomically: a reader never sees half a report (OutputWriteError when it fails)."""
    write_text_atomic(path, json.dumps(_json_safe(data), indent=2, allow_nan=False) + "\n", "--report")


def write_error_report(path: str, message: str, exit_code: int) -> None:
    """The report of a run that could not start (bad usage or input): status error, the message, the code."""
    write_report(path, build_report(NotRun("error", error=message), exit_code=exit_code))


def write_interrupted_report(path: str, exit_code: int, note: str) -> None:
    """The report of a run interrupted before it began: clean, interrupted, nothing run, the signal's code."""
    write_report(path, build_report(NotRun("clean", interrupted=True, notes=[note]), exit_code=exit_code))
