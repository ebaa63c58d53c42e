"""Lightning DDP with 2 CPU processes (gloo), run by test_lightning_ddp.py: `python lightning_ddp.py CASE OUT`.

Lightning's DDP launcher re-runs this script for rank 1. The sampler deals batches 0, 2, 4, ... to rank 0 and
1, 3, 5, ... to rank 1, so a poison in batch 3 reaches rank 1 only, in its second micro-batch.
"""

import sys

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from debug_nan.integrations.lightning import DebugNaNCallback
from tests.support.frameworks import tasks

CASES = {  # module, loss, batches
    "forward_on_rank1": (tasks.Net, tasks.net_loss, tasks.masked_batches(empty_at=(3,))),
    # the NaN is born in rank 1's backward only; DDP's gradient all-reduce shows it on both ranks
    "backward_on_rank1": (tasks.Norms, tasks.norms_loss, tasks.norm_batches(zero_at=(3,))),
}


def main(case: str, out: str) -> None:
    net, loss, batches = CASES[case]

    class Lit(net, pl.LightningModule):
        def training_step(self, batch, batch_idx):
            return loss(self, batch)

        def configure_optimizers(self):
            return tasks.optimizer(self.parameters())

    torch.manual_seed(0)
    callback = DebugNaNCallback(report=f"{out}/r.json")
    trainer = pl.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=4, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         callbacks=[callback])
    trainer.fit(Lit(), DataLoader(batches, batch_size=None))
    f = callback.finding
    print(f"RANK {trainer.global_rank} status {callback.status} global_step {trainer.global_step} finding "
          f"{f and (f.rank, f.step, f.micro_step, f.phase, f.cause)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
