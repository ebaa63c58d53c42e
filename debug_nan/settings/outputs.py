"""OutputSettings: what a run leaves behind (the config's [output] table): the report, the log's copy, the plot,
TensorBoard events, repro bundles, the history table's layout, the quiet log."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from debug_nan.settings.tables import check_choices, setting


@dataclass
class OutputSettings:
    TABLE: ClassVar[str] = "output"
    TITLE: ClassVar[str] = "Output options"

    report: str | None = None
    log: str | None = None
    plot: str | None = None
    bundle_dir: str | None = None
    bundle: bool = True
    history: str = setting("compact", choices=("compact", "full"))  # presentation/history_rows.py: blocks
    # grouped to fit one screen, or every layer
    quiet: bool = False  # the header, one line per step and the summary
    tensorboard: str | None = None  # a folder for TensorBoard event files, written at the end of the run

    def validate(self) -> None:
        check_choices(self)

    def bundle_folder(self) -> str:
        """Where a finding's repro bundle goes: --bundle-dir, else the report's folder, else the current folder."""
        return self.bundle_dir or (str(Path(self.report).parent) if self.report else ".")
