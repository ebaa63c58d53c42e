"""The finding: where the first NaN/Inf was born and why, in the JSON report's `first_nonfinite` schema."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

CAUSES = (
    "all_masked_softmax", "log_of_nonpositive", "div_by_zero", "invalid_domain", "grad_at_singularity", "overflow",
    "inf_arithmetic", "nonfinite_input", "nonfinite_parameter", "gradient_explosion", "unknown",
)
PHASES = ("data", "forward", "loss", "backward", "optimizer")


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
    bundle: str | None = None  # repro bundle: `debug-nan replay BUNDLE` reaches this finding again

    def __post_init__(self):
        assert self.cause in CAUSES, self.cause
        assert self.phase in PHASES, self.phase

    def to_dict(self) -> dict:
        return asdict(self)
