"""torchrun / DistributedDataParallel support.

Under torchrun (RANK, WORLD_SIZE, LOCAL_RANK in the environment) the run initialises the process group (NCCL on
CUDA, gloo on CPU), wraps the model in DDP, shards the micro-batches across ranks and seeds per rank. Every
micro-batch the ranks agree on a trip with ONE all-reduce (MAX) of a [world] vector of phase codes computed on
the device, folded into the watch's single host sync: every rank stops at the same point, and all know which
rank(s) saw the non-finite value first (the earliest phase wins). That rank replays and pinpoints without
collectives; the finding is broadcast, and rank 0 writes the log and the report.

To be deadlock-free whatever user code does, DDP's own reducer stays idle (every backward runs under no_sync(),
and DDP does not broadcast buffers in forward). The gradients are averaged by drivers/trainer/overlap.py during the
backward of each step's last micro-batch, as DDP would, with a fixed set of bucket all-reduces that every rank issues in
the same order even when its forward or backward raised; then comes the agreement. `average_gradients` below is the
plain, end-of-step averaging that an optimizer-phase replay uses.
"""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from debug_nan import torch_support
from debug_nan.errors import InputError


class SetupFailedOnARank(InputError):
    """Every rank raises this from agree_on_setup when some rank could not set up the run."""


@dataclass
class DistContext:
    rank: int
    world: int
    local_rank: int

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def detect() -> DistContext | None:
    """The torchrun environment, or None for a single process."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    try:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        local = int(os.environ.get("LOCAL_RANK", rank))
    except ValueError:
        raise InputError("RANK / WORLD_SIZE / LOCAL_RANK must be integers (set by torchrun).") from None
    return DistContext(rank, world, local) if world > 1 else None


def init(ctx: DistContext, device_spec: str, timeout_s: float = 300.0) -> torch.device:
    """Initialise the process group and return this rank's device."""
    use_cuda = device_spec != "cpu" and torch.cuda.is_available()
    if device_spec.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--device {device_spec}: this machine has no usable CUDA device.")
    device = torch.device("cuda", ctx.local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        dist.init_process_group("nccl" if use_cuda else "gloo", timeout=timedelta(seconds=timeout_s),
                                **({"device_id": device} if use_cuda else {}))
    return device


def wrap_ddp(model: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """The model in DDP, as the user's run has it (parameters and buffers broadcast from rank 0 once), without
    DDP's buffer broadcast in every forward: a collective there would strand the other ranks when one raises."""
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                   **torch_support.ddp_without_buffer_broadcast())


def agree(local_code: torch.Tensor, ctx: DistContext) -> torch.Tensor:
    """[world] codes, each rank's own slot filled, MAX-reduced: everyone learns every rank's code."""
    codes = torch.zeros(ctx.world, device=local_code.device, dtype=torch.float32)
    codes[ctx.rank] = local_code
    dist.all_reduce(codes, op=dist.ReduceOp.MAX)
    return codes


def agree_on_setup(ctx: DistContext, device: torch.device, failure: BaseException | None) -> None:
    """Every rank calls this after building its task, before DDP's first collective: when any rank failed (bad
    input, Ctrl-C / SIGTERM), every rank raises the same InputError naming the first failing rank and its message,
    so rank 0 writes the error report instead of being killed by torchrun while it waits."""
    failed = agree(torch.tensor(1.0 if failure is not None else 0.0, device=device), ctx).tolist()
    if max(failed) == 0.0:
        return
    src = failed.index(max(failed))
    message = broadcast(_setup_message(failure) if ctx.rank == src else None, src)
    raise SetupFailedOnARank(f"rank {src} could not set up the run: {message}")


def _setup_message(failure: BaseException | None) -> str:
    if isinstance(failure, KeyboardInterrupt):
        return f"interrupted ({failure.args[0] if failure.args else 'Ctrl-C'}) while building the task"
    return str(failure)


def allreduce_mean(tensors: list[torch.Tensor], ctx: DistContext) -> None:
    """Average tensors over the ranks in place: one flat all-reduce per dtype."""
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(t.dtype, []).append(t)
    for group in by_dtype.values():
        flat = _flatten_dense_tensors(group)
        dist.all_reduce(flat)
        flat.div_(ctx.world)
        for t, reduced in zip(group, _unflatten_dense_tensors(flat, group)):
            t.copy_(reduced)


def average_gradients(named: list[tuple[str, torch.nn.Parameter]], ctx: DistContext
                      ) -> list[tuple[str, torch.nn.Parameter]]:
    """Average the gradients over the ranks (every rank must call this). Returns the parameters that have a
    gradient: one that no rank used stays None, as in a single process."""
    used = used_anywhere([p.grad is not None for _, p in named], ctx)
    named = [(n, p) for (n, p), u in zip(named, used) if u]
    for _, p in named:
        if p.grad is None:  # unused on this rank only: the others have a gradient
            p.grad = torch.zeros_like(p)
    allreduce_mean([p.grad for _, p in named], ctx)
    return named


def used_anywhere(flags: list[bool], ctx: DistContext) -> list[bool]:
    """Which parameters got a gradient on at least one rank (one small all-reduce)."""
    t = torch.tensor(flags, dtype=torch.float32, device=_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(v) for v in t.tolist()]


def _device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def gather_objects(obj, ctx: DistContext) -> list:
    """Every rank's `obj` (picklable), by rank, on every rank."""
    out = [None] * ctx.world
    dist.all_gather_object(out, obj)
    return out


def broadcast(obj, src: int):
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def finish() -> None:
    """Wait for every rank (rank 0 writes the report meanwhile), then leave the process group."""
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def leave_together(code: int) -> None:
    """End this rank's process with `code` once every rank is done. torchrun SIGTERMs the other workers as soon
    as one exits non-zero, so from here on a SIGTERM exits with this rank's own code, and the process leaves
    without the interpreter's slow teardown (during which the default SIGTERM action is back)."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(code))
    finish()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
