"""AAM's own `pretrain --fsdp` path, driven by a small script (no debug-nan inside), for torchrun:

    torchrun --nproc_per_node=N aam_fsdp.py [--bug none|count] [--steps N] [--device cuda|cpu]

The real AAM code (aam_checkout.py: $DEBUG_NAN_AAM_DIR) at commit 6f65d20 of github.com/jbk708/aam (2026-01-28):
089f32d, the commit aam_pretrain.py drives, has no FSDP path. Built as `pretrain --fsdp` builds them: AAM's
setup_distributed (NCCL, one GPU per rank), its SequenceEncoder (nucleotide head on; `--count-embedding` on, so that
a count can carry the planted bug), wrapped by its wrap_model_fsdp (FullyShardedDataParallel, each
nn.TransformerEncoderLayer a unit, device_id the current CUDA device), its MultiTaskLoss and Trainer.train_epoch
with gather_for_distributed=True (the UniFrac loss all_gathers every rank's embeddings and targets). One epoch of
`--steps` synthetic batches, different on each rank: tokens [B, T, 1 + BP] (START 5, then bases 1..4; sample i keeps
3 + i ASVs, the other slots are padding), counts [B, T] (1..100 on the ASVs, 0 on padding), unifrac_target [B, B].
Rank 0 prints the epoch's mean losses (what train_epoch returns).

--bug count: the last rank's batch of step 2 (rank 1's of 2) counts -1 reads for its sample 0's first ASV (a
missing value's sentinel): AAM's count embedding takes log(count + 1) = log(0) = -inf there, its sample encoder
replaces the NaN that follows with 0 (torch.where), the loss stays finite and the NaN goes into the gradients (FSDP's
reduce-scatter then gives every rank NaN gradients); alone, the run goes on until step 3, where AAM's own check
raises on every rank ("NaN values found in embeddings before attention pooling"). The other ranks' batches stay
healthy. (AAM's inputs cannot
carry a finite overflow: tokens are integers, counts go through that log, and the UniFrac targets are gathered to
every rank.)
--device cpu: a dry run of the same code on gloo, for machines without a GPU: wrap_model_fsdp refuses the CPU, so
its CUDA checks are pointed at the CPU for that one call (FSDP then shards on the CPU). Not a path AAM supports.
"""

import argparse
from unittest import mock

import torch

import aam_checkout

aam_checkout.use()

from aam.models.sequence_encoder import SequenceEncoder  # noqa: E402
from aam.training.distributed import cleanup_distributed, setup_distributed, wrap_model_fsdp  # noqa: E402
from aam.training.losses import MultiTaskLoss  # noqa: E402
from aam.training.trainer import Trainer  # noqa: E402

TOKENS, BASES, BATCH = 8, 16, 4

parser = argparse.ArgumentParser()
parser.add_argument("--bug", default="none", choices=["none", "count"])
parser.add_argument("--steps", type=int, default=3)
parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
args = parser.parse_args()


def batches(n: int, rank: int) -> list[dict]:
    """This rank's n batches {"tokens" [B, T, 1 + BASES] long, "counts" [B, T] float, "unifrac_target" [B, B]}."""
    g = torch.Generator().manual_seed(100 + rank)
    out = []
    for _ in range(n):
        tokens = torch.zeros(BATCH, TOKENS, 1 + BASES, dtype=torch.long)
        counts = torch.zeros(BATCH, TOKENS)
        for i in range(BATCH):
            kept = 3 + i
            tokens[i, :kept, 0] = 5
            tokens[i, :kept, 1:] = torch.randint(1, 5, (kept, BASES), generator=g)
            counts[i, :kept] = torch.randint(1, 101, (kept,), generator=g).float()
        d = torch.rand(BATCH, BATCH, generator=g)
        d = (d + d.T) / 2
        d.fill_diagonal_(0)
        out.append({"tokens": tokens, "counts": counts, "unifrac_target": d})
    return out


def wrapped(model: torch.nn.Module) -> torch.nn.Module:
    """AAM's own FSDP wrapping (on the CPU dry run, with its CUDA checks pointed at the CPU)."""
    if args.device == "cuda":
        return wrap_model_fsdp(model)
    with mock.patch.object(torch.cuda, "is_available", lambda: True), \
            mock.patch.object(torch.cuda, "current_device", lambda: torch.device("cpu")):
        return wrap_model_fsdp(model)


rank, world, device = setup_distributed(backend="nccl" if args.device == "cuda" else "gloo")
torch.manual_seed(0)
model = SequenceEncoder(vocab_size=7, embedding_dim=32, max_bp=BASES, token_limit=TOKENS, asv_num_layers=1,
                        asv_num_heads=2, sample_num_layers=1, sample_num_heads=2, encoder_num_layers=1,
                        encoder_num_heads=2, predict_nucleotides=True, count_embedding=True, asv_dropout=0.0,
                        sample_dropout=0.0, encoder_dropout=0.0)
model = wrapped(model)
trainer = Trainer(model, MultiTaskLoss(penalty=1.0, nuc_penalty=1.0, count_penalty=1.0),
                  optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), device=device,
                  gather_for_distributed=True)
data = batches(args.steps, rank)
if args.bug == "count" and rank == world - 1 and args.steps >= 2:
    data[1]["counts"][0, 0] = -1.0
losses = trainer.train_epoch(torch.utils.data.DataLoader(data, batch_size=None))
if rank == 0:
    print({k: round(float(v), 6) for k, v in sorted(losses.items())}, flush=True)
cleanup_distributed()
