"""When `debug-nan run`'s in-place replay fell short on a micro-batch: the finding says so and its first suggestion
is the exact command that traces that micro-batch as it runs (`--trace-at`, engine/replay/live.py).

Two ways short: the tape could not be replayed (NOT_REPLAYED: the reason is in the finding), or it was replayed
and stayed finite where the run did not (STAYED_FINITE): in `run` that is the script's code doing something
torch's function hooks do not see (saved-tensor hooks that compress activations, code outside torch), more often
than a kernel. An update's trip is replayed exactly (never traced live), so it gets no such suggestion.
"""

from __future__ import annotations

import shlex

from debug_nan.engine.explain.evidence import STAYED_FINITE
from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.vocabulary import Phase

NOT_REPLAYED = "could not be replayed in place"
RUN_STAYED_FINITE = (f"{STAYED_FINITE} where the run did not: the replay did not follow everything the script's "
                     f"code did in the run (e.g. torch.autograd.graph.saved_tensors_hooks that store activations in "
                     f"float16, code outside torch's function hooks, a kernel that computes otherwise), so the op "
                     f"is not named.")


def trace_at_command(step: int, micro: int, command: list[str] | None) -> str:
    """`debug-nan run --trace-at STEP:MICRO -- COMMAND`, the command as the user typed it (quoted for a shell)."""
    return f"debug-nan run --trace-at {step}:{micro} -- {shlex.join(command) if command else '...'}"


def suggest_trace_at(finding: Finding | None, command: list[str] | None) -> None:
    """A watch-only finding of a micro-batch the replay could not follow: say so (in run's words) and put the
    `--trace-at` command first among the suggestions. Any other finding is left as it is."""
    if finding is None or finding.detected_by != "watch" or finding.phase == Phase.OPTIMIZER:
        return
    if STAYED_FINITE in finding.explanation and finding.reproducible is not False:
        head = finding.explanation.split(STAYED_FINITE, 1)[0]
        finding.explanation = head + RUN_STAYED_FINITE
    elif STAYED_FINITE in finding.explanation:
        pass  # (replayed twice: the explanation already says what the two replays showed)
    elif NOT_REPLAYED not in finding.explanation:
        return
    again = trace_at_command(finding.step, finding.micro_step, command)
    finding.suggestions.insert(0, f"Run the command again as `{again}`: it traces that micro-batch as it runs and "
                                  f"names the op (the command runs again up to there, its files written again; the "
                                  f"NaN must come back: seed the run).")
