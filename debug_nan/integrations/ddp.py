"""Multi-process runs the framework drives (Lightning's DDP strategies, HF Trainer under torchrun / accelerate).

Every micro-batch the ranks agree on a trip with the watch's own all-reduce of phase codes (the CLI's, folded into
the one host sync), so all ranks stop at the same micro-batch. Unlike the CLI, the framework all-reduces the
gradients inside the last micro-batch's backward: a NaN born in rank 1's backward shows on every rank. So every
rank that saw the earliest phase replays ITS OWN micro-batch under the tracer (in parallel, no collectives), and
the first rank whose replay finds an origin is the one reported; it writes the bundle, the finding is broadcast.

Not agreed on: user code raising (the framework's backward on the other ranks may already be inside a gradient
all-reduce, so no collective can be added there). That rank pinpoints alone and writes its own report; the
framework then ends the job as it would without the callback.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from debug_nan.errors import describe_exception
from debug_nan.checks.watch import PHASE_CODE
from debug_nan.train.distributed import DistContext, agree, broadcast


def context() -> DistContext | None:
    """The process group the framework initialised, or None for one process."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    rank = dist.get_rank()
    return DistContext(rank, dist.get_world_size(), int(os.environ.get("LOCAL_RANK", rank)))


def decide_across_ranks(m, result, bad, last: bool):
    """The same decision on every rank from the all-reduced codes; the finding (or None) comes back on all."""
    codes = result.rank_codes
    top = max(codes)
    if top == 0:
        return m.check_explosion() if last else None  # the averaged gradients: the same norms on every rank
    first = [r for r, c in enumerate(codes) if c == top]
    rank = m.dist.rank
    if top == PHASE_CODE["grad"] and m.scaler is not None:
        mine = bad is not None and bad.kind == "grad"
        genuine = mine and not m.rec.scaler_skipped and not (m.scaler.get_scale() >= 1.0 and m.probe_without_scaling())
        verdict = agree(torch.tensor(float(genuine), device=m.device), m.dist).tolist()
        if max(verdict) == 0.0:
            m.scaler_overflow(probe=True)
            return None
        first = [r for r, v in enumerate(verdict) if v > 0]
    if top == PHASE_CODE["param"]:  # identical parameters everywhere: every rank re-runs its share, one traces
        src, previous = first[0], m._previous
        if previous is None:
            return None
        finding = m.pinpointer.pinpoint(previous, len(previous.batches), bad, None, optimizer=True,
                                        trace=rank == src)
        if rank == src:
            m.save_bundle(finding, previous, len(previous.batches), bad, True)
        return _agreed(m, broadcast(finding if rank == src else None, src), src, first, previous.snapshot)
    finding = None
    try:
        if rank in first:
            finding = m.pinpointer.pinpoint(m.inputs, m.micro, bad, None)
    except Exception as exc:  # noqa: BLE001 - the other ranks wait for this rank's answer
        m.log(f"  [ddp] rank {rank} could not replay: {describe_exception(exc)}", "yellow")
    found = finding is not None and finding.detected_by != "watch"
    flags = agree(torch.tensor(1.0 if found else 0.0, device=m.device), m.dist).tolist()
    src = next((r for r, f in enumerate(flags) if f > 0), first[0])
    if rank == src and finding is not None:
        m.save_bundle(finding, m.inputs, m.micro, bad, False)
    return _agreed(m, broadcast(finding if rank == src else None, src), src, first, m.inputs.snapshot)


def _agreed(m, finding, src: int, first: list[int], snapshot):
    if finding is not None:
        finding.rank, finding.first_ranks = src, first
    else:
        m.notes.append(f"rank {src} saw a non-finite value but could not pinpoint it (see its log).")
    return m.stop(finding, snapshot)



def let_gloo_workers_finish(seconds: float = 0.1) -> None:
    """Hand the GIL to gloo's worker threads before the process may exit (a torchrun script that ends right after
    trainer.train()). The Trainer's last all_gather (store_flos, just before on_train_end) leaves its tensors to
    be freed by the gloo worker thread, which needs the GIL for that; if the interpreter is finalizing by then the
    thread is ended inside a noexcept destructor: std::terminate, "terminate called without an active exception",
    exit -6 after a clean run (seen in 2 of 6 runs on a loaded 2-core machine, with or without this callback).
    Sleeping releases the GIL to the waiting thread; a no-op outside a multi-process gloo run."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 and dist.get_backend() == "gloo":
        time.sleep(seconds)
