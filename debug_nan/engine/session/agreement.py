"""The DDP side of the trip decision: every rank decides the same, from the phase codes all-reduced in the
watch's one sync per micro-batch.

The earliest phase wins. Every rank that saw it replays its own micro-batch (no collectives during the replay:
where a framework averages the gradients inside the backward, every rank sees a NaN born on one), and the first
whose replay named an op is the one reported; its finding is broadcast. An optimizer-phase trip is re-run by every
rank (the gradient averaging of the replay needs them all) and traced by the first. A rank that has to stop for a
non-numerical reason (bad input, out of memory, Ctrl-C) makes every rank stop with its message and exit code, so no rank
is ever left waiting in a collective.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.replay.driver import TaskFailure, is_out_of_memory
from debug_nan.engine.session.distributed import DistContext, agree, broadcast, gather_objects
from debug_nan.engine.session.outcome import MicroOutcome
from debug_nan.engine.vocabulary import CheckKind, Phase
from debug_nan.engine.watch.history import StepRecord
from debug_nan.engine.watch.phase_codes import ABORT_CODE, CODE_PHASE, PHASE_CODE
from debug_nan.errors import InputError, describe_exception


class RunAborted(Exception):
    """Under DDP: a rank has to stop for a non-numerical reason; every rank stops with the same message."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code

    def __reduce__(self):  # (broadcast to the other ranks: an Exception pickles its args alone)
        return RunAborted, (str(self), self.exit_code)

    @staticmethod
    def describe(exc: BaseException | None) -> tuple[str, int]:
        if isinstance(exc, KeyboardInterrupt):  # process/interrupts.py raises KeyboardInterrupt("SIGTERM")
            if exc.args[:1] == ("SIGTERM",):
                return "interrupted (SIGTERM)", 143
            return "interrupted (Ctrl-C)", 130
        if isinstance(exc, InputError):
            return str(exc), 2
        if exc is not None and is_out_of_memory(exc):
            return f"out of memory: {describe_exception(exc)}", 2
        return describe_exception(exc) if exc is not None else "stopped", 1


class FindingHeld(Exception):
    """A finding this rank made outside training (a forward of its validation pass), which the other ranks, busy in
    their own loop, did not see: passed as the `abort` of its next agreed sync, so that every rank stops with it."""

    def __init__(self, finding):
        super().__init__("a finding outside training")
        self.finding = finding


class FoundElsewhere(Exception):
    """Raised on every rank at the sync where a rank told its held finding (FindingHeld): the run stops with it."""

    def __init__(self, finding):
        super().__init__("a finding of another rank")
        self.finding = finding


MADE, RECEIVED, SEEN = 3.0, 2.0, 1.0  # what a rank's replay found: an op that made the value, a value already
# non-finite when this rank's code used it (received), only the watch's reading


def _origin_line(outcome) -> str:
    """What this rank's own replay found, in one line (the report's `rank_origins`)."""
    if isinstance(outcome, Finding):
        module = outcome.module or ("<loss code>" if outcome.phase == Phase.LOSS else "<model root>")
        where = f"{outcome.phase} {outcome.op or '(no op)'} in `{module}`"
        return f"{where} at {outcome.source or '?'}: {outcome.cause} ({outcome.detected_by})"
    if outcome is None:
        return "not replayed"
    return f"failed: {str(outcome)[:160]}"


def _score(outcome) -> float:
    """A replay's outcome -> MADE, RECEIVED, SEEN, or 0 (no finding, a failure)."""
    if not isinstance(outcome, Finding):
        return 0.0
    if outcome.detected_by == "watch":
        return SEEN
    return MADE if outcome.op else RECEIVED


@dataclass(frozen=True)
class RankPlan:
    """Under DDP, who replays a trip: the earliest phase code on any rank and the ranks that saw it."""

    top: float  # the earliest phase code (engine/watch/phase_codes.py)
    first: list[int]  # the ranks that saw it
    together: bool = False  # a sharded model (FSDP): its forward and backward are collectives, every rank replays

    @property
    def src(self) -> int:
        return self.first[0]

    @property
    def update(self) -> bool:
        """An optimizer update is the suspect: the parameters are the same everywhere, so every rank re-runs its
        share of the step (the gradients are averaged as in the run) and the first traces the update alone."""
        return self.top == PHASE_CODE[CheckKind.PARAM]

    @property
    def gradients_only(self) -> bool:
        return self.top == PHASE_CODE[CheckKind.GRAD]

    def replays(self, rank: int) -> tuple[bool, bool]:
        """(whether this rank replays, whether it traces): each rank that saw the earliest phase replays ITS OWN
        micro-batch, in parallel and with no collectives (where the framework averages the gradients inside the
        backward, every rank sees the NaN); for an update every rank re-runs and the first traces. A sharded model
        (`together`) replays on every rank at once, each tracing its own micro-batch: FSDP's all-gathers and
        reduce-scatters run again in the replay, so no rank can replay alone (a bad batch is no replay)."""
        if self.together and not self.update:
            return self.top != PHASE_CODE[CheckKind.DATA] or rank in self.first, True
        if self.update:
            return True, rank == self.src
        return rank in self.first, True


class RankAgreement:
    def __init__(self, ctx: DistContext, device: torch.device, log):
        self.ctx, self.device, self.log = ctx, device, log
        self.together = False  # a sharded model: every rank replays a trip together (RankPlan.together)

    def agree_codes(self, local_code: torch.Tensor) -> torch.Tensor:
        """The watch's per-micro-batch phase code -> every rank's code [world] (one MAX all-reduce)."""
        return agree(local_code, self.ctx)

    def plan(self, o: MicroOutcome) -> RankPlan | None:
        """From every rank's phase code: None when all are clean, else who saw the earliest phase first. An abort
        on any rank raises RunAborted on every rank, with the first aborting rank's message and exit code."""
        codes = o.rank_codes
        top = max(codes)
        if top == 0:
            return None
        first = [r for r, c in enumerate(codes) if c == top]
        if top == ABORT_CODE:  # every rank stops; the first aborting rank says why (or tells its finding)
            mine = (RunAborted.describe(o.abort), getattr(o.abort, "finding", None)) if self.ctx.rank == first[0] \
                else None
            reason, finding = broadcast(mine, first[0])
            if finding is not None:
                raise FoundElsewhere(finding)
            raise RunAborted(f"rank {first[0]}: {reason[0]}", reason[1])
        return RankPlan(top, first, self.together)

    def overflow_verdict(self, plan: RankPlan, genuine: bool) -> RankPlan | None:
        """fp16, a gradient trip: every rank's verdict on whether its non-finite gradients are more than the loss
        scale's overflow (`genuine`) -> the plan among the ranks that say so, or None where none does (the step is
        the scaler's skip)."""
        verdict = agree(torch.tensor(1.0 if genuine else 0.0, device=self.device), self.ctx).tolist()
        if max(verdict) == 0.0:
            return None
        return RankPlan(plan.top, [r for r, v in enumerate(verdict) if v > 0], plan.together)

    def announce(self, plan: RankPlan) -> None:
        self.log(f"  [ddp] trip seen by rank(s) {plan.first} first (phase {CODE_PHASE[int(plan.top)]}); "
                 f"{'they replay their own micro-batch' if len(plan.first) > 1 else f'rank {plan.src} pinpoints'}, "
                 f"{'every rank replays with them (the model is sharded)' if plan.together else 'the others wait'}.",
                 "red")

    @staticmethod
    def failure(exc: BaseException, rank: int) -> TaskFailure | RunAborted:
        """What this rank tells the others when its replay raised (they wait for its answer)."""
        if isinstance(exc, TaskFailure):
            return exc
        if isinstance(exc, KeyboardInterrupt):
            reason, code = RunAborted.describe(exc)
            return RunAborted(f"rank {rank} was {reason} while pinpointing", code)
        return RunAborted(f"rank {rank} failed while pinpointing: {describe_exception(exc)}", 1)

    def report(self, plan: RankPlan, outcome) -> Finding | None:
        """Every rank's replay outcome -> the one reported, the same on every rank: the first rank whose replay
        named the op that made the value (else the first that named something: a value already non-finite when its
        own code used it, such as one received through the script's `all_gather`; else the first that saw the
        trip). The ranks whose replay found the value already made say so in the finding. A failure is raised on
        every rank."""
        src, scores = plan.src, None
        if not plan.update and (len(plan.first) > 1 or plan.together):
            # (a rank that replayed only to take part in the sharded model's collectives is not a candidate)
            score = _score(outcome) if self.ctx.rank in plan.first else 0.0
            scores = agree(torch.tensor(score, device=self.device), self.ctx).tolist()
            origins = gather_objects(_origin_line(outcome), self.ctx)  # each rank's own origin, kept
            best = max(scores)
            src = next((r for r, f in enumerate(scores) if f == best and f > 0), src)
        outcome = broadcast(outcome if self.ctx.rank == src else None, src)
        if isinstance(outcome, (TaskFailure, RunAborted)):
            raise outcome
        if outcome is not None:
            outcome.rank, outcome.first_ranks = src, plan.first
            if scores is not None:
                outcome.rank_origins = {str(r): line for r, line in enumerate(origins)}
            received = [r for r, f in enumerate(scores or []) if f == RECEIVED and r != src]
            if received and _score(outcome) == MADE:
                outcome.explanation += (f" Rank(s) {', '.join(map(str, received))} saw it too, already non-finite "
                                        f"when their own code first used it: they received rank {src}'s value (a "
                                        f"collective of the script's: all_gather, all_reduce, broadcast).")
        return outcome

    def name_explosion(self, finding: Finding, steps: list[StepRecord]) -> None:
        """An explosion of the averaged (or, sharded, global) gradient norms is the same on every rank: the rank it
        came from is the one whose OWN loss grew the most over its smallest earlier loss (a rank's loss is its
        own data's; its gradients are not, once averaged). Every rank calls this at the same step (one MAX
        all-reduce of [world] growth factors) -> finding.rank, first_ranks (the ranks within 10x of that growth)
        and a sentence of evidence."""
        last = steps[-1].loss if steps else None
        earlier = [abs(r.loss) for r in steps[:-1] if r.loss is not None and math.isfinite(r.loss)]
        ratio = abs(last) / max(min(earlier), 1e-30) if earlier and last is not None and math.isfinite(last) else 0.0
        ratios = agree(torch.tensor(min(ratio, 3e38), device=self.device), self.ctx).tolist()
        top = max(range(len(ratios)), key=lambda r: ratios[r])
        finding.rank = top
        finding.first_ranks = [r for r, v in enumerate(ratios) if v > 0 and v * 10 >= ratios[top]] or [top]
        others = ", ".join(f"rank {r}: {v:.3g}x" for r, v in enumerate(ratios) if r != top)
        finding.explanation += (f" It comes from rank {top}: its own loss grew {ratios[top]:.3g}x over its smallest "
                                f"earlier value by step {finding.step} ({others}); the gradients of every rank are "
                                f"averaged, so each rank's norms show it.")

    def gradient_norms(self, named_params: list[tuple[str, torch.nn.Parameter]], record: StepRecord
                       ) -> list[torch.Tensor]:
        """The norms of the averaged gradients (drivers/trainer/overlap.py averaged them during the backward), for the
        history, the explosion check and clipping: identical on every rank."""
        named = [(n, p) for n, p in named_params if p.grad is not None]
        norms = torch._foreach_norm([p.grad for _, p in named])
        values = torch.stack([n.double() for n in norms]).cpu().tolist()  # one more sync per step, DDP only
        record.grad_norms = {name: v for (name, _), v in zip(named, values)}
        record.grad_norm = math.sqrt(sum(v * v for v in values))
        return list(norms)
