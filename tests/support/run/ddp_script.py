"""A DistributedDataParallel training script as a user writes it (no debug-nan inside), for torchrun on CPU:

    torchrun --nproc_per_node=2 ddp_script.py [--bug BUG] [--steps N] [--lr LR]

Every rank builds the same model (seed 0), wraps it in DDP (gloo) and trains on its own share of the batches:
rank r takes batches r, r + world, ... (each step one micro-batch per rank). Rank 0 prints the loss averaged
over the ranks every step. --bug masked: rank 1's batch of step 2 has a sample with no valid key (NaN in the
softmax, on rank 1 only); overflow: both ranks' batches of step 3 have targets ~1e20; lr: a learning rate that
explodes the gradients; nan-lr: the learning rate is NaN in step 2's update (a NaN in every parameter);
nan-batch: rank 1's batch of step 2 holds a NaN; zero-norm: rank 1's loss of step 2 adds the sqrt of a zero
tensor (finite, but NaN in its backward: the gradients of both ranks are NaN after DDP's all-reduce).
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

parser = argparse.ArgumentParser()
parser.add_argument("--bug", default="none",
                    choices=["none", "masked", "overflow", "lr", "nan-lr", "nan-batch", "zero-norm"])
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--lr", type=float, default=1e-2)
parser.add_argument("--exit-code", type=int, default=0)
parser.add_argument("--noise-on-rank1", action="store_true", help="rank 1 adds noise from the OS: not reproducible")
parser.add_argument("--raise-on-rank1", action="store_true", help="rank 1 raises a ValueError at step 3")
args = parser.parse_args()

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = DistributedDataParallel(models.Net())
optimizer = torch.optim.AdamW(model.parameters(), lr=1e3 if args.bug == "lr" else args.lr)
at = {"masked": {"empty_at": (1 * world + 1,)}, "overflow": {"big_at": (2 * world, 2 * world + 1)}}
data = models.batches(labels=True, n=args.steps * world, **at.get(args.bug, {}))[rank::world]
if args.bug == "nan-batch" and rank == 1:
    data[1]["x"][3, 0, 0] = float("nan")  # a corrupt value in rank 1's batch of step 2
if args.noise_on_rank1 and rank == 1:
    noise = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    for batch in data:
        batch["x"] += 1e-3 * torch.randn(batch["x"].shape, generator=noise)
for step, batch in enumerate(data, start=1):
    if args.raise_on_rank1 and rank == 1 and step == 3:
        raise ValueError("rank 1 cannot read its batch")
    loss = models.regression_loss(model, batch)
    if args.bug == "zero-norm" and rank == 1 and step == 2:
        loss = loss + (model.module.head.weight * 0).pow(2).sum().sqrt()  # finite; its backward 0 * inf = NaN
    loss.backward()
    if args.bug == "nan-lr" and step == 2:
        optimizer.param_groups[0]["lr"] = float("nan")  # a schedule gone wrong, on every rank
    optimizer.step()
    optimizer.zero_grad()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    if rank == 0:
        print(f"step {step} loss {mean.item() / world:.6f}", flush=True)
dist.destroy_process_group()
sys.exit(args.exit_code)
