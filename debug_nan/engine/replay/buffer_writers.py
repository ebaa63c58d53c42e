"""Buffers that went non-finite during the run, and the op that wrote each (a provisional origin).

When the watch sees a buffer become non-finite at step k (BufferWatch), the pinpointer replays that micro-batch's
forward under the tracer while step k's snapshot still exists, and keeps the writer here. If harm later (a later
step, the eval pass) descends from that buffer, the finding is the writer: step k and its op, not "an earlier step
wrote it". If nothing ever descends from it, the summary says so in a note.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from debug_nan.engine.explain.finding import Finding

BUFFER_LABEL = "buffer `"


def buffer_name(label: str | None) -> str | None:
    """'buffer `bn.running_var`' -> 'bn.running_var'; None for other labels."""
    if label and label.startswith(BUFFER_LABEL) and label.endswith("`"):
        return label[len(BUFFER_LABEL):-1]
    return None


@dataclass
class Written:
    name: str  # the buffer
    step: int
    micro: int
    held: str  # "nan", "inf"
    finding: Finding | None  # the writer, as a finding of that step; None when the replay could not name it
    why_unnamed: str = ""
    reached_harm: bool = False


class BufferWriters:
    def __init__(self):
        self.written: dict[str, Written] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.written

    @property
    def names(self) -> frozenset:
        return frozenset(self.written)

    def add(self, entry: Written) -> None:
        self.written.setdefault(entry.name, entry)

    def finding_for(self, label: str | None, step: int, micro: int, watch: str | None) -> Finding | None:
        """The writer's finding when `label` (a pre-existing origin met by a replay) is a buffer whose writer is
        known, told as reaching harm at (step, micro); None otherwise."""
        entry = self.written.get(buffer_name(label) or "")
        if entry is None or entry.finding is None:
            return None
        entry.reached_harm = True
        f = entry.finding
        where = "the eval pass after step" if micro == 0 else f"step {step}, micro-batch"
        harm = f"{where} {step}" if micro == 0 else f"{where} {micro}"
        told = (f" This op wrote buffer `{entry.name}` at step {entry.step}, micro-batch {entry.micro} (the watch saw "
                f"it turn {entry.held.upper()} there, without harm yet); the buffer kept the value, and at {harm} it "
                f"reached the harm{f' ({watch})' if watch else ''}.")
        return replace(f, explanation=f.explanation + told, watch=watch or f.watch,
                       suggestions=list(f.suggestions) + [f"Check what writes buffer `{entry.name}` (an in-place "
                                                          f"update under no_grad, a running statistic): guard the "
                                                          f"update, not the later use."])

    def notes(self) -> list[str]:
        """One line per buffer that went non-finite without its value reaching harm in this run."""
        out = []
        for e in self.written.values():
            if e.reached_harm:
                continue
            by = (f"written by {e.finding.op} in {e.finding.phase}"
                  f"{f' (module `{e.finding.module}`)' if e.finding.module else ''}"
                  f"{f' at {e.finding.source}' if e.finding.source else ''}: {e.finding.cause}"
                  if e.finding is not None else e.why_unnamed)
            out.append(f"buffer `{e.name}` turned {e.held.upper()} at step {e.step}, micro-batch {e.micro}, {by}; "
                       f"the loss, every gradient and every parameter stayed finite after it in this run")
        return out
