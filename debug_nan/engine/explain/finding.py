"""The finding: where the first NaN/Inf was born and why, in the JSON report's `first_nonfinite` schema. Plain values
(no torch): the top process of `debug-nan run -- PROGRAM` renders its ranks' findings without importing it. Built
by explain.py (from the op-level replay) and evidence.py (the findings that need no replay)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from debug_nan.engine.sharded import user_path
from debug_nan.engine.vocabulary import Cause, Phase


@dataclass
class Finding:
    step: int  # optimizer step, 1-based
    micro_step: int  # micro-batch within the step, 1-based
    phase: str
    module: str
    module_type: str
    op: str | None
    kind: str  # "nan" | "inf"
    cause: str
    explanation: str
    source: str | None
    suggestions: list[str]
    # beyond the contract: evidence for people and tools
    source_line: str | None = None
    backward_node: str | None = None
    forward_source: str | None = None
    sample_ids: list[str] | None = None
    inputs: dict[str, dict] = field(default_factory=dict)  # name -> TensorStats dict
    outputs: dict[str, dict] = field(default_factory=dict)
    watch: str | None = None  # what the cheap watch tier saw first
    exception: str | None = None
    detected_by: str = "replay"  # "replay" | "watch" | "data check" | "gradient history"
    rank: int | None = None  # under torchrun: the rank that pinpointed (the first to see it)
    first_ranks: list[int] | None = None  # every rank that saw it in the earliest phase
    rank_origins: dict[str, str] | None = None  # under torchrun, when several ranks replayed: what each one found
    bundle: str | None = None  # repro bundle: `debug-nan replay BUNDLE` reaches this finding again
    # where the op itself ran inside an installed library (torch.nn, transformers), beside `source` (the user's line)
    inside: str | None = None  # "torch/nn/functional.py:2987"
    inside_line: str | None = None  # "return torch.layer_norm("
    # False: two replays of the run's own state and batch stayed finite (a transient fault, outside them)
    reproducible: bool | None = None
    notes: list[str] = field(default_factory=list)  # what the replay saw besides the origin (a buffer nothing read)

    def __post_init__(self):
        # one declared vocabulary (engine/vocabulary.py): an undeclared code is a ValueError here, and the finding
        # keeps the plain string, so reports and bundles hold no Python enum
        self.cause = Cause(self.cause).value
        self.phase = Phase(self.phase).value
        self.module = user_path(self.module)  # (every entry point's finding names modules as the user wrote them)

    def to_dict(self) -> dict:
        return asdict(self)
