"""Multi-process runs the framework drives (Lightning's DDP strategies, HF Trainer under torchrun / accelerate).

Every micro-batch the ranks agree on a trip with the watch's own all-reduce of phase codes (the CLI's, folded into
the one host sync, decided by engine/session/agreement.py as in the CLI), so all ranks stop at the same micro-batch.
Unlike the CLI, the framework all-reduces the gradients inside the last micro-batch's backward: a NaN born in rank 1's
backward shows on every rank, so every rank that saw the earliest phase replays its own micro-batch and the first
whose replay names an op is reported.

Not agreed on: user code raising (the framework's backward on the other ranks may already be inside a gradient
all-reduce, so no collective can be added there). That rank pinpoints alone and writes its own report; the
framework then ends the job as it would without the callback.
"""

from __future__ import annotations

import os
import time

import torch.distributed as dist

from debug_nan.engine.session.distributed import DistContext


def context() -> DistContext | None:
    """The process group the framework initialised, or None for one process."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return None
    rank = dist.get_rank()
    return DistContext(rank, dist.get_world_size(), int(os.environ.get("LOCAL_RANK", rank)))


def let_gloo_workers_finish(seconds: float = 0.1) -> None:
    """Hand the GIL to gloo's worker threads before the process may exit (a torchrun script that ends right after
    trainer.train()). The Trainer's last all_gather (store_flos, just before on_train_end) leaves its tensors to
    be freed by the gloo worker thread, which needs the GIL for that; if the interpreter is finalizing by then the
    thread is ended inside a noexcept destructor: std::terminate, "terminate called without an active exception",
    exit -6 after a clean run (seen in 2 of 6 runs on a loaded 2-core machine, with or without this callback).
    Sleeping releases the GIL to the waiting thread; a no-op outside a multi-process gloo run."""
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1 and dist.get_backend() == "gloo":
        time.sleep(seconds)
