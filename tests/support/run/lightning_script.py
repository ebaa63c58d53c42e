"""A Lightning script, as a user writes it (no debug-nan inside): the masked-attention net of
tests/support/frameworks/tasks.py as a LightningModule; prints the loss of every step.

    python lightning_script.py [--bug none|masked] [--accumulate N] [--steps N]
"""

import argparse
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root, for its test models

from tests.support.frameworks import tasks

parser = argparse.ArgumentParser()
parser.add_argument("--bug", default="none", choices=["none", "masked"])
parser.add_argument("--accumulate", type=int, default=1)
parser.add_argument("--steps", type=int, default=6)
args = parser.parse_args()


class Lit(tasks.Net, pl.LightningModule):
    def training_step(self, batch, batch_idx):
        loss = tasks.net_loss(self, batch)
        print(f"batch {batch_idx} loss {loss.item():.6f}")
        return loss

    def configure_optimizers(self):
        return tasks.optimizer(self.parameters())


torch.manual_seed(0)
model = Lit()
batches = tasks.masked_batches(empty_at=(3,) if args.bug == "masked" else ())
trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=args.steps, accumulate_grad_batches=args.accumulate,
                     logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False)
trainer.fit(model, DataLoader(batches, batch_size=None))
