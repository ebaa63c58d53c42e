"""Plain log lines around the long data steps (reading a table, tokenising, synthesizing), and the memory figures
those lines quote.

They are ordinary log lines, not a progress bar, so a run under `tee`, SLURM or `nohup` shows them too: a silent
minute looks like a hang.
"""

from __future__ import annotations

import time
from pathlib import Path


def quiet(*_args, **_kwargs) -> None:
    """The log of a caller that wants none."""


class Phase:
    """`with Phase(log, "Reading x (3.1 MB)") as phase: ...; phase.done("Read x: ...")` logs the first line before
    the work and the done line (or "<doing>: done") after it, with the seconds it took."""

    def __init__(self, log, doing: str):
        self.log = log or quiet
        self.doing = doing
        self.result: str | None = None
        self.start = 0.0

    def __enter__(self) -> "Phase":
        self.log(f"{self.doing} ...")
        self.start = time.perf_counter()
        return self

    def done(self, result: str) -> None:
        self.result = result

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            seconds = time.perf_counter() - self.start
            self.log(f"{self.result or self.doing + ': done'} in {seconds:.2f} s.")


def human_bytes(n: float) -> str:
    """1536 -> '1.5 KB' (powers of 1024, as `free -h` and the OOM messages count)."""
    for unit in ("bytes", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"  # pragma: no cover


def file_size(path: str | Path) -> str:
    try:
        return human_bytes(Path(path).stat().st_size)
    except OSError:
        return "size unknown"
