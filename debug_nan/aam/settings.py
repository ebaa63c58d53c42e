"""AAMSettings: the built-in task's own settings, its data ([data]) and its model ([model]); read by aam/ alone
(a --task may read them too, through the flat settings it is given: app/job_settings.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar

from debug_nan.errors import InputError
from debug_nan.settings.tables import check_choices, setting

TITLE = "AAM pipeline options (the built-in model and data; a --task may read them)"


def _positive(component, names: tuple[str, ...]) -> None:
    for name in names:
        value = getattr(component, name)
        if value is None or value <= 0:
            raise InputError(f"--{name.replace('_', '-')} must be a positive integer, got {value}.")


@dataclass
class AAMData:
    TABLE: ClassVar[str] = "data"
    TITLE: ClassVar[str] = TITLE

    data_dir: str = "./data"
    table: str | None = None
    tree: str | None = None
    sequences: str | None = None
    token_limit: int = 512
    batch_size: int = 6
    asv_order: str = setting("first", choices=("first", "abundance", "random"))
    rarefy_depth: int | None = None
    unifrac: str = setting("unweighted", choices=("unweighted", "weighted"))
    synthetic_samples: int = 48
    # samples held out for the eval pass (None: 1/8, at least one batch); in [train], where configs have had it
    eval_samples: int | None = setting(None, table="train")

    def validate(self) -> None:
        _positive(self, ("token_limit", "batch_size", "synthetic_samples"))
        if self.rarefy_depth is not None and self.rarefy_depth <= 0:
            raise InputError(f"--rarefy-depth must be a positive integer, got {self.rarefy_depth}.")
        if self.eval_samples is not None and self.eval_samples <= 0:
            raise InputError(f"--eval-samples must be a positive integer, got {self.eval_samples}.")
        check_choices(self)


@dataclass
class AAMModel:
    TABLE: ClassVar[str] = "model"
    TITLE: ClassVar[str] = TITLE

    d_model: int = 128
    heads: int = 4
    asv_layers: int = 2
    sample_layers: int = 2
    encoder_layers: int = 2
    ffn_mult: int = 4
    dropout: float = 0.1
    guards: bool = True
    # "torch": nn.TransformerEncoder (its inference fast path: PYT-8.9 as it happened)
    asv_encoder: str = setting("builtin", choices=("builtin", "torch"))
    asv_chunk_size: int | None = None
    nuc_weight: float = 1.0
    unifrac_weight: float = 1.0

    def validate(self) -> None:
        _positive(self, ("d_model", "heads", "ffn_mult", "asv_layers", "sample_layers", "encoder_layers"))
        if self.d_model % self.heads:
            raise InputError(f"--d-model ({self.d_model}) must be divisible by --heads ({self.heads}).")
        for name in ("nuc_weight", "unifrac_weight"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise InputError(f"--{name.replace('_', '-')} must be a positive finite number, got {value}.")
        if self.asv_chunk_size is not None and self.asv_chunk_size <= 0:
            raise InputError(f"--asv-chunk-size must be a positive integer, got {self.asv_chunk_size}.")
        if not 0.0 <= self.dropout < 1.0:
            raise InputError(f"--dropout must be in [0, 1), got {self.dropout}.")
        check_choices(self)


@dataclass
class AAMSettings:
    """The built-in task's settings: its data and its model."""

    data: AAMData = field(default_factory=AAMData)
    model: AAMModel = field(default_factory=AAMModel)
