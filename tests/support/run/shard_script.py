"""A sharded pretraining script as a user writes it (no debug-nan inside), for torchrun on CPU (gloo):

    torchrun --nproc_per_node=2 shard_script.py [--shard fsdp2|fsdp2-linear|fsdp1|ddp] [--bug BUG] [--steps N]
                                                [--device cpu|cuda] [--width W] [--memory]

The model is a cascade of 3 transformer encoder stages between an input projection and a head. `--shard fsdp2`
shards each stage and the root with `fully_shard`, `fsdp2-linear` each Linear and the root, `fsdp1` wraps it in
FullyShardedDataParallel (each stage its own unit), `ddp` in DistributedDataParallel. Each rank trains on its own
batches (seeded by rank); rank 0 prints the loss averaged over the ranks every step.

--bug lr: a learning rate of 1e30 (the second step's forward overflows); corrupt: rank 1's batch of step 3 holds
one finite value 3e38 (rank 1's forward overflows); grow: rank 1's targets grow tenfold every 3 steps (the
gradients explode on rank 1 alone, then everywhere through the averaging); nan-lr: the learning rate is NaN in step 2's
update (every parameter NaN); hidden: a padding token in rank 1's batch of step 2 whose log(0) = -inf the forward
drops with torch.where (only the gradients go NaN: 0 / 0 in log's backward), as AAM's count encoder does. --gather-loss:
the loss gathers every rank's pooled embeddings with `dist.all_gather` (the local slice put back for its gradient) and
compares every pair, as a pairwise (UniFrac-like) loss does; with --bug corrupt every rank's loss is then NaN.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--shard", default="fsdp2", choices=["fsdp2", "fsdp2-linear", "fsdp1", "ddp"])
parser.add_argument("--bug", default="none", choices=["none", "lr", "corrupt", "grow", "nan-lr", "hidden"])
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--gather-loss", action="store_true")
parser.add_argument("--width", type=int, default=16)
parser.add_argument("--device", default="cpu", help="cpu (gloo) or cuda (NCCL, one GPU per rank: LOCAL_RANK)")
parser.add_argument("--memory", action="store_true", help="each rank prints its peak RSS (MiB) to stderr at the end")
args = parser.parse_args()

WIDTH, TOKENS, BATCH = args.width, 6, 4


class Stage(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.TransformerEncoderLayer(WIDTH, nhead=2, dim_feedforward=2 * WIDTH, dropout=0.0,
                                                  batch_first=True)

    def forward(self, x):
        return self.encoder(x)


class Cascade(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(8, WIDTH)
        self.cascade_stages = nn.ModuleList(Stage() for _ in range(3))
        self.head = nn.Linear(WIDTH, 1)

    def forward(self, x):
        h = self.embed(x)
        if args.bug == "hidden":  # a log-scaled token norm; padding tokens (all-zero features) left out by where
            norm = (h * (x.abs().sum(-1, keepdim=True) > 0)).pow(2).sum(-1)  # [B, T], 0 on padding
            h = h + 0.01 * torch.where(norm > 0, torch.log(norm), 0.0).unsqueeze(-1)
        for stage in self.cascade_stages:
            h = stage(h)
        return self.head(h).squeeze(-1)  # [B, T]


def gathered(local: torch.Tensor) -> torch.Tensor:
    """Every rank's rows [world * B, D], this rank's own slice kept in the graph (its gradient flows back)."""
    g = [torch.zeros_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(g, local.detach())
    g[dist.get_rank()] = local
    return torch.cat(g)


def loss_of(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    if not args.gather_loss:
        return ((out - y) ** 2).mean()
    emb = gathered(out)  # [world * B, T]
    pairs = torch.cdist(emb, emb)  # every pair of samples, across the ranks
    return ((out - y) ** 2).mean() + 1e-3 * pairs.mean()


cuda = args.device == "cuda"
device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(device)
dist.init_process_group("nccl" if cuda else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()
torch.manual_seed(0)
model = Cascade().to(device)
if args.shard == "fsdp2":
    from torch.distributed.fsdp import fully_shard

    for stage in model.cascade_stages:
        fully_shard(stage)
    fully_shard(model)
elif args.shard == "fsdp2-linear":
    from torch.distributed.fsdp import fully_shard

    for module in list(model.modules()):
        if type(module) is nn.Linear:  # (not attention's out_proj: its forward reads the weight, never calls it)
            fully_shard(module)
    fully_shard(model)
elif args.shard == "fsdp1":
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    model = FullyShardedDataParallel(model, device_id=device, auto_wrap_policy=ModuleWrapPolicy({Stage}))
else:
    from torch.nn.parallel import DistributedDataParallel

    model = DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e30 if args.bug == "lr" else 1e-3)

data = torch.Generator().manual_seed(100 + rank)
for step in range(1, args.steps + 1):
    x = torch.randn(BATCH, TOKENS, 8, generator=data).to(device)
    y = torch.randn(BATCH, TOKENS, generator=data).to(device)
    if args.bug == "hidden" and rank == 1 and step == 2:
        x[1, 5] = 0.0  # a padding token
    if args.bug == "corrupt" and rank == 1 and step == 3:
        x[2, 1, 5] = 3e38  # one corrupt value: finite, but the first projection overflows
    if args.bug == "grow" and rank == 1:
        y = y * 10.0 ** (step // 3)
    loss = loss_of(model(x), y)
    loss.backward()
    if args.bug == "nan-lr" and step == 2:
        optimizer.param_groups[0]["lr"] = float("nan")  # a schedule gone wrong, on every rank
    optimizer.step()
    optimizer.zero_grad()
    mean = loss.detach().clone()
    dist.all_reduce(mean)
    if rank == 0:
        print(f"step {step} loss {mean.item() / world:.6f}", flush=True)
if args.memory:
    import resource

    print(f"rank {rank} peak_rss_mib {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} "
          f"parameters_mib {sum(p.numel() for p in model.parameters()) * 4 / 2**20:.0f}", file=sys.stderr, flush=True)
dist.destroy_process_group()
sys.exit(0)
