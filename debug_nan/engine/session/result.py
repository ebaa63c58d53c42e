"""RunResult: what a run hands to the output pipeline (presentation/pipeline.py): its status, findings, history and
notes. Plain values (no torch): the top process of `debug-nan run -- PROGRAM` builds one from its ranks' results
without importing it."""

from __future__ import annotations

from dataclasses import dataclass, field

from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.watch.history import History


@dataclass
class RunResult:
    status: str  # "clean" | "nonfinite" | "error"
    steps_run: int
    finding: Finding | None = None
    findings: list[Finding] = field(default_factory=list)
    error: str | None = None
    history: History = field(default_factory=History)
    notes: list[str] = field(default_factory=list)
    interrupted: bool = False
    exit_code: int | None = None  # overrides the status's code (an abort under DDP: 2 for bad input, ...)
    recipe: dict | None = None  # what the run trained with (optimizer, lr, schedule, clipping)
