"""A sharded Lightning script as a user writes it (no debug-nan inside), for torchrun (Lightning takes the ranks from
torchrun's environment and starts no processes of its own):

    torchrun --nproc_per_node=N lightning_sharded.py fsdp|model_parallel|ddp [--bug none|masked] [--steps S]
                                                     [--accelerator cuda|cpu]

The LightningModule holds the masked-attention Net of tests/support/models.py as `net` (x [4, 6, D], valid [4, 6]
-> [4, 6]; its training_step calls `self.net`). fsdp: Lightning's FSDPStrategy (FullyShardedDataParallel around the
module, each MaskedAttention a unit of its own; Lightning refuses it on the CPU); model_parallel:
ModelParallelStrategy with a data-parallel mesh of N, whose configure_model applies FSDP2's `fully_shard` to
`net.attn` and `net`; ddp: DDPStrategy (the same script where FSDP cannot run). Rank r of N trains on batches r,
r + N, ... (its own DataLoader: Lightning's DistributedSampler, which would shuffle, is off). Rank 0 prints the loss
of each of its micro-batches.

--bug masked: batch 3's sample 2 has no valid key (its softmax row is 0/0): rank 1's second micro-batch (step 2)
with 2 ranks, step 4 with one.
"""

import argparse
import os
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root, for its test models

from tests.support import models

parser = argparse.ArgumentParser()
parser.add_argument("strategy", choices=["fsdp", "model_parallel", "ddp"])
parser.add_argument("--bug", default="none", choices=["none", "masked"])
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--accelerator", default="cuda", choices=["cuda", "cpu"])
args = parser.parse_args()
DEVICES = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun's processes: one device each
RANK = int(os.environ.get("RANK", "0"))


class Lit(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = models.Net()

    def configure_model(self):
        if args.strategy == "model_parallel":  # FSDP2 over the data-parallel mesh the strategy made
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            fully_shard(self.net.attn, mesh=mesh)
            fully_shard(self.net, mesh=mesh)

    def training_step(self, batch, batch_idx):
        loss = models.regression_loss(self.net, batch)
        if self.global_rank == 0:
            print(f"batch {batch_idx} loss {loss.item():.6f}", flush=True)
        return loss

    def configure_optimizers(self):  # (after configure_model and the wrapping: the sharded parameters)
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def strategy():
    from lightning.pytorch import strategies

    if args.strategy == "fsdp":
        return strategies.FSDPStrategy(auto_wrap_policy={models.MaskedAttention})
    if args.strategy == "model_parallel":
        return strategies.ModelParallelStrategy(data_parallel_size=DEVICES, tensor_parallel_size=1)
    return strategies.DDPStrategy()


torch.manual_seed(0)
model = Lit()
trainer = pl.Trainer(accelerator=args.accelerator, devices=DEVICES, strategy=strategy(), max_steps=args.steps,
                     use_distributed_sampler=False, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
batches = models.batches(n=DEVICES * args.steps, empty_at=(3,) if args.bug == "masked" else ())
trainer.fit(model, DataLoader(batches[RANK::DEVICES], batch_size=None))
