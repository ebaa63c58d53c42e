"""The declared vocabulary of a finding: its phases, its cause codes, and the words its advice uses per entry point.

Phases and causes are `str` enums: a member compares equal to its code ("forward", "overflow"), so the JSON report
and every existing comparison keep working, while a typo in code becomes an AttributeError instead of a silent
mismatch. A new cause is declared here (with its suggestions in causes/wording.py and its rule in causes/).

Advice is written once, in the CLI's words (its flags). An entry point whose user cannot pass a flag (the Python
API, the Lightning and HF callbacks, a script under `debug-nan run`) gets the same advice in its own words:
`adapt_advice(finding, dialect)`.
"""

from __future__ import annotations

import re
from enum import Enum


class CheckKind(str, Enum):
    """What a watch check read (engine/watch): the harm kinds (PARAM: a parameter or optimizer state, LOSS,
    LOSS_PART, GRAD) and the evidence kinds (DATA: a batch tensor, FORWARD: a module output, BUFFER)."""

    PARAM = "param"
    DATA = "data"
    FORWARD = "forward"
    LOSS = "loss"
    LOSS_PART = "loss_part"
    GRAD = "grad"
    BUFFER = "buffer"

    def __str__(self) -> str:
        return self.value


class Phase(str, Enum):
    DATA = "data"
    FORWARD = "forward"
    LOSS = "loss"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"
    EVAL = "eval"  # the validation pass (--eval-every)

    def __str__(self) -> str:
        return self.value


class Cause(str, Enum):
    ALL_MASKED_SOFTMAX = "all_masked_softmax"
    LOG_OF_NONPOSITIVE = "log_of_nonpositive"
    DIV_BY_ZERO = "div_by_zero"
    INVALID_DOMAIN = "invalid_domain"
    GRAD_AT_SINGULARITY = "grad_at_singularity"
    OVERFLOW = "overflow"
    INF_ARITHMETIC = "inf_arithmetic"
    INFEASIBLE_TARGET = "infeasible_target"
    MASKED_VALUE_USED = "masked_value_used"
    NONFINITE_INPUT = "nonfinite_input"
    NONFINITE_PARAMETER = "nonfinite_parameter"
    GRADIENT_EXPLOSION = "gradient_explosion"
    UNKNOWN = "unknown"

    def __str__(self) -> str:
        return self.value


# the phase a watch check stands for, when no replay names a finer one
PHASE_OF_KIND = {CheckKind.PARAM: Phase.OPTIMIZER.value, CheckKind.DATA: Phase.DATA.value,
                 CheckKind.FORWARD: Phase.FORWARD.value, CheckKind.LOSS: Phase.LOSS.value,
                 CheckKind.LOSS_PART: Phase.LOSS.value, CheckKind.GRAD: Phase.BACKWARD.value}  # (a buffer: no harm)

DIALECTS = ("cli", "api", "lightning", "hf", "script")
# a CLI flag -> what a user of each other entry point sets instead
_FLAG_WORDS = {
    "--max-grad-norm": {"api": "torch.nn.utils.clip_grad_norm_ before optimizer.step()",
                        "lightning": "Trainer(gradient_clip_val=...)", "hf": "TrainingArguments(max_grad_norm=...)",
                        "script": "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) in your loop, "
                                  "between backward() and optimizer.step()"},
    "--trace-every-step": {"api": "Monitor(..., detailed=True)", "lightning": "a debug_nan.Monitor(detailed=True) "
                           "around the step", "hf": "a debug_nan.Monitor(detailed=True) around the step",
                           "script": "the per-layer history in this log (every module output is measured in a "
                                     "run's first 16 steps)"},
    "--explosion-threshold": {"api": "Monitor(explosion_threshold=...)",
                              "lightning": "DebugNaNCallback(explosion_threshold=...)",
                              "hf": "DebugNaNCallback(explosion_threshold=...)",
                              "script": "debug-nan run --explosion-threshold"},
    "--precision bf16": {"api": "torch.autocast(dtype=torch.bfloat16)", "lightning": "Trainer(precision='bf16-mixed')",
                         "hf": "TrainingArguments(bf16=True)",
                         "script": "torch.autocast(device_type, dtype=torch.bfloat16) around your forward and loss"},
    "--warmup-steps": {"api": "a warmup schedule", "lightning": "a warmup schedule in configure_optimizers",
                       "hf": "TrainingArguments(warmup_steps=...)",
                       "script": "a warmup schedule in your script (e.g. torch.optim.lr_scheduler.LinearLR)"},
}
# a flag and the value it was shown with ("--max-grad-norm 1.0"); longer flags first ("--precision bf16")
_FLAGS = re.compile("(?P<flag>" + "|".join(re.escape(f) for f in sorted(_FLAG_WORDS, key=len, reverse=True))
                    + r")(?:\s+\d+(?:\.\d+)?)?")


def in_dialect(text: str, dialect: str) -> str:
    """`text` written for the CLI, in the words of `dialect` (unchanged for "cli")."""
    if dialect == "cli" or not text:
        return text
    return _FLAGS.sub(lambda m: _FLAG_WORDS[m.group("flag")].get(dialect, m.group(0)), text)


def adapt_advice(finding, dialect: str):
    """The finding's explanation and suggestions in the words of the entry point that will show them."""
    if dialect not in DIALECTS:
        raise ValueError(f"unknown advice dialect {dialect!r}: one of {', '.join(DIALECTS)}")
    if dialect != "cli":
        finding.explanation = in_dialect(finding.explanation, dialect)
        finding.suggestions = [in_dialect(s, dialect) for s in finding.suggestions]
    return finding
