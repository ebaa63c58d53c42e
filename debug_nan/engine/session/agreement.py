"""The DDP side of the trip decision: every rank decides the same, from the phase codes all-reduced in the
watch's one sync per micro-batch.

The earliest phase wins. Every rank that saw it replays its own micro-batch (no collectives during the replay:
where a framework averages the gradients inside the backward, every rank sees a NaN born on one), and the first
whose replay named an op is the one reported; its finding is broadcast. An optimizer-phase trip is re-run by every
rank (the gradient averaging of the replay needs them all) and traced by the first. A rank that has to stop for a non-numerical reason (bad input, out of memory, Ctrl-C) makes every rank
stop with its message and exit code, so no rank is ever left waiting in a collective.
"""

from __future__ import annotations

import math
from typing import Callable

import torch

from debug_nan.engine.replay.driver import TaskFailure, is_out_of_memory
from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.watch.history import StepRecord
from debug_nan.engine.watch.phase_codes import ABORT_CODE, CODE_PHASE, PHASE_CODE
from debug_nan.errors import InputError, describe_exception
from debug_nan.engine.session.distributed import DistContext, agree, broadcast
from debug_nan.engine.session.outcome import MicroOutcome


class RunAborted(Exception):
    """Under DDP: a rank has to stop for a non-numerical reason; every rank stops with the same message."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code

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


class RankAgreement:
    def __init__(self, ctx: DistContext, device: torch.device, log):
        self.ctx, self.device, self.log = ctx, device, log

    def agree_codes(self, local_code: torch.Tensor) -> torch.Tensor:
        """The watch's per-micro-batch phase code -> every rank's code [world] (one MAX all-reduce)."""
        return agree(local_code, self.ctx)

    def decide(self, o: MicroOutcome, pinpoint: Callable[[MicroOutcome, bool], Finding | None],
               genuine_gradient_trip: Callable[[MicroOutcome], bool] | None,
               skip_overflow: Callable[[MicroOutcome], None]) -> Finding | None:
        """The same decision on every rank. `pinpoint(o, trace)` replays (trace=False: only take part in the
        gradient averaging); `genuine_gradient_trip(o)` (fp16 only) says whether this rank's non-finite gradients
        are more than the loss scale's overflow; `skip_overflow(o)` marks the step as skipped by the scaler."""
        codes = o.rank_codes
        top = max(codes)
        if top == 0:
            return None
        first = [r for r, c in enumerate(codes) if c == top]
        src = first[0]
        if top == ABORT_CODE:  # every rank stops; the first aborting rank says why
            reason = broadcast(RunAborted.describe(o.abort) if self.ctx.rank == src else None, src)
            raise RunAborted(f"rank {src}: {reason[0]}", reason[1])
        if top == PHASE_CODE["grad"] and genuine_gradient_trip is not None and o.record is not None:
            # the ranks whose own gradients tripped probe them without the loss scale; all agree on the verdict
            genuine = 1.0 if o.check is not None and genuine_gradient_trip(o) else 0.0
            verdict = agree(torch.tensor(genuine, device=self.device), self.ctx).tolist()
            if max(verdict) == 0.0:
                skip_overflow(o)
                return None
            first = [r for r, v in enumerate(verdict) if v > 0]
            src = first[0]
        self.log(f"  [ddp] trip seen by rank(s) {first} first (phase {CODE_PHASE[int(top)]}); "
                 f"{'they replay their own micro-batch' if len(first) > 1 else f'rank {src} pinpoints'}, "
                 f"the others wait.", "red")
        rank = self.ctx.rank
        outcome = None
        try:
            if top == PHASE_CODE["param"]:
                # identical parameters everywhere: every rank re-runs its share of the step and the gradients are
                # averaged as in the run; the first rank then traces the optimizer step alone
                outcome = pinpoint(o, rank == src)
            elif rank in first:
                # each rank that saw the earliest phase replays ITS OWN micro-batch (in parallel, no collectives):
                # where the framework averages the gradients inside the backward, every rank sees the NaN
                outcome = pinpoint(o, True)
        except TaskFailure as failure:
            outcome = failure
        except BaseException as exc:  # noqa: BLE001 - the other ranks wait for this rank's answer
            if isinstance(exc, KeyboardInterrupt):
                reason, code = RunAborted.describe(exc)
                outcome = RunAborted(f"rank {rank} was {reason} while pinpointing", code)
            else:
                outcome = RunAborted(f"rank {rank} failed while pinpointing: {describe_exception(exc)}", 1)
        if top != PHASE_CODE["param"] and len(first) > 1:
            # the first rank whose replay named an op is the one reported (else the first that saw it)
            named = isinstance(outcome, Finding) and outcome.detected_by != "watch"
            flags = agree(torch.tensor(1.0 if named else 0.0, device=self.device), self.ctx).tolist()
            src = next((r for r, f in enumerate(flags) if f > 0), src)
        outcome = broadcast(outcome if rank == src else None, src)
        if isinstance(outcome, (TaskFailure, RunAborted)):
            raise outcome
        if outcome is not None:
            outcome.rank, outcome.first_ranks = src, first
        return outcome

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
