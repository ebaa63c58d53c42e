"""A DDP training script as a user writes it (no debug-nan inside), started however its user starts it:

    torchrun --nproc_per_node=2 launched.py [--bug BUG]          (or accelerate launch, a shell script calling it)
    python launched.py --spawn PORT [--bug BUG]                  (torch.multiprocessing.spawn starts the 2 ranks)

Every rank builds the same model (seed 0), wraps it in DDP (gloo) and trains 4 steps on its share of the batches
(rank r takes batches r, r + world, ...), then after each step runs a validation pass on a batch of its own under
no_grad. Rank 0 prints the training loss averaged over the ranks and its own validation loss. --bug overflow:
rank 1's batch of step 3 has targets ~1e20 (its squared error overflows, on rank 1 only); eval: rank 1's validation
batch after step 2 holds a sample with no valid key (NaN in the softmax, only in rank 1's validation pass); exit:
rank 1 raises SystemExit(3) at step 3. --cuda (under torchrun): NCCL, one GPU per rank.
"""

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root, for its test models

from tests.support import models

STEPS = 4


def train(rank: int, world: int, bug: str, device: torch.device | None = None) -> None:
    torch.manual_seed(0)
    model = models.Net()
    model = DistributedDataParallel(model.to(device), device_ids=[device]) if device else DistributedDataParallel(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = models.batches(labels=True, n=STEPS * world, big_at=(2 * world + 1,) if bug == "overflow" else ())
    data = on(data[rank::world], device)
    checks = models.batches(n=STEPS * world, seed=1, empty_at=(1 * world + 1,) if bug == "eval" else ())
    checks = on(checks[rank::world], device)
    for step, batch in enumerate(data, start=1):
        if bug == "exit" and rank == 1 and step == 3:
            raise SystemExit(3)  # (as `raise SystemExit(main())` ends a script: no sys.exit call to see)
        loss = models.regression_loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        with torch.no_grad():
            val = models.regression_loss(model, checks[step - 1])
        if rank == 0:
            print(f"step {step} loss {mean.item() / world:.6f} val {val.item():.6f}", flush=True)


def on(batches: list[dict], device: torch.device | None) -> list[dict]:
    return batches if device is None else [{k: v.to(device) for k, v in b.items()} for b in batches]


def spawned(rank: int, world: int, port: int, bug: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    train(rank, world, bug)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--bug", default="none", choices=["none", "overflow", "eval", "exit"])
    parser.add_argument("--cuda", action="store_true", help="under torchrun: NCCL, one GPU per rank")
    parser.add_argument("--spawn", type=int, default=None, metavar="PORT", help="start 2 ranks with mp.spawn")
    args = parser.parse_args()
    if args.spawn is not None:
        torch.multiprocessing.spawn(spawned, args=(2, args.spawn, args.bug), nprocs=2)
    elif args.cuda:  # (one GPU per rank, NCCL: scripts/gpu_check.py's launcher item)
        local = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local)
        dist.init_process_group("nccl")
        train(dist.get_rank(), dist.get_world_size(), args.bug, torch.device("cuda", local))
    else:
        dist.init_process_group("gloo")
        train(dist.get_rank(), dist.get_world_size(), args.bug)
        dist.destroy_process_group()
