"""An Accelerate script as a user writes it (no debug-nan inside), sharded by Accelerate's FSDP plugin, for torchrun:

    torchrun --nproc_per_node=N accelerate_sharded.py 1|2 [--bug none|masked] [--steps S] [--cpu]

The masked-attention Net of tests/support/models.py (x [4, 6, D], valid [4, 6] -> [4, 6]) and its AdamW, prepared
together by an Accelerator whose FullyShardedDataParallelPlugin has `fsdp_version` 1 (FullyShardedDataParallel) or
2 (`fully_shard`), each MaskedAttention a unit of its own (transformer_based_wrap). A plain loop:
`accelerator.backward(loss)`, `optimizer.step()`. Rank r of N trains on batches r, r + N, ...; rank 0 prints the
loss of each of its micro-batches.

--bug masked: batch 3's sample 2 has no valid key (its softmax row is 0/0): rank 1's second micro-batch (step 2)
with 2 ranks, step 4 with one.
--cpu: Accelerator(cpu=True), where Accelerate does not shard (FSDP needs GPUs): the plugin is left out and the model
is wrapped in DDP, a dry run of the rest of the script.
"""

import argparse
import sys
from pathlib import Path

import torch
from accelerate import Accelerator, FullyShardedDataParallelPlugin

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root, for its test models

from tests.support import models

parser = argparse.ArgumentParser()
parser.add_argument("fsdp_version", type=int, choices=[1, 2])
parser.add_argument("--bug", default="none", choices=["none", "masked"])
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--cpu", action="store_true")
args = parser.parse_args()

plugin = FullyShardedDataParallelPlugin(fsdp_version=args.fsdp_version, auto_wrap_policy="transformer_based_wrap",
                                        transformer_cls_names_to_wrap=["MaskedAttention"])
accelerator = Accelerator(cpu=True) if args.cpu else Accelerator(fsdp_plugin=plugin)
rank, world = accelerator.process_index, accelerator.num_processes
torch.manual_seed(0)
model = models.Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
model, optimizer = accelerator.prepare(model, optimizer)
batches = models.batches(n=world * args.steps, empty_at=(3,) if args.bug == "masked" else ())
for i, batch in enumerate(batches[rank::world]):
    batch = {k: v.to(accelerator.device) for k, v in batch.items()}
    loss = models.regression_loss(model, batch)
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    if rank == 0:
        print(f"batch {i} loss {loss.item():.6f}", flush=True)
accelerator.end_training()
