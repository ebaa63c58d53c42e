"""A Lightning script as a user writes it (no debug-nan inside) whose DDP ranks Lightning starts itself: `python
lightning_launched.py` re-runs this script once per other rank (Lightning's subprocess launcher, gloo on CPU).

    python lightning_launched.py [--bug none|overflow|eval] [--accelerator cpu|gpu]

Two ranks train the masked-attention net of tests/support/models.py for 4 steps, a validation pass after each step;
rank 0 prints each step's training loss. --bug overflow: rank 1's batch of step 3 has targets ~1e20 (its squared
error overflows); eval: rank 1's validation batch after step 2 holds a sample with no valid key (NaN in the softmax,
only in rank 1's validation pass).
"""

import argparse
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root, for its test models

from tests.support import models

parser = argparse.ArgumentParser()
parser.add_argument("--bug", default="none", choices=["none", "overflow", "eval"])
parser.add_argument("--accelerator", default="cpu", help="cpu (gloo) or gpu (NCCL, one GPU per rank)")
args = parser.parse_args()
STEPS, WORLD = 4, 2


class Batches(Dataset):
    """Rank r's batches (each already a batch): r, r + WORLD, ... of one list, as the plain DDP scripts deal them."""

    def __init__(self, batches):
        self.batches = batches

    def __len__(self):
        return len(self.batches) // WORLD

    def __getitem__(self, i):
        return self.batches[i * WORLD + pl.utilities.rank_zero.rank_zero_only.rank]


class Lit(models.Net, pl.LightningModule):
    def training_step(self, batch, batch_idx):
        loss = models.regression_loss(self, batch)
        if self.global_rank == 0:
            print(f"step {batch_idx + 1} loss {loss.item():.6f}", flush=True)
        return loss

    def validation_step(self, batch, batch_idx):
        return models.regression_loss(self, batch)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


torch.manual_seed(0)
train = models.batches(labels=True, n=STEPS * WORLD, big_at=(2 * WORLD + 1,) if args.bug == "overflow" else ())
checks = models.batches(n=STEPS * WORLD, seed=1, empty_at=(1 * WORLD + 1,) if args.bug == "eval" else ())
trainer = pl.Trainer(accelerator=args.accelerator, devices=WORLD, strategy="ddp", max_steps=STEPS, val_check_interval=1,
                     limit_val_batches=1, num_sanity_val_steps=0, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False, use_distributed_sampler=False)
trainer.fit(Lit(), DataLoader(Batches(train), batch_size=None), DataLoader(Batches(checks), batch_size=None))
