"""AAM's own pretraining, driven by a small script (no debug-nan inside): the real AAM code at commit 089f32d
(a checkout of github.com/jbk708/aam at that commit, found at $DEBUG_NAN_AAM_DIR: it is not committed here),
its SequenceEncoder, MultiTaskLoss and Trainer.train_epoch, on synthetic
microbiome batches whose samples hold fewer ASVs than the token limit (the rest of the slots are padding, all-zero
rows: the historical PYT-8.9 NaN).

    python aam_pretrain.py [--steps N]

Its dependencies that this environment lacks: scikit-learn (used only by AAM's validation metrics, which this
script does not run): a stand-in module that raises if called takes its place (aam_checkout.py).
"""

import argparse

import torch

import aam_checkout

aam_checkout.use()

from aam.models.sequence_encoder import SequenceEncoder  # noqa: E402
from aam.training.losses import MultiTaskLoss  # noqa: E402
from aam.training.trainer import Trainer  # noqa: E402

TOKEN_LIMIT, BASES, BATCH = 8, 150, 4

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=3)
args = parser.parse_args()


def batches(n: int, seed: int = 0) -> list[dict]:
    """{"tokens": [B, TOKEN_LIMIT, 1 + BASES] (START 5, then bases 1..4; padding slots all 0), "unifrac_target":
    [B, B]}; sample i keeps 3 + i ASVs, the other slots are padding."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        tokens = torch.zeros(BATCH, TOKEN_LIMIT, 1 + BASES, dtype=torch.long)
        for i in range(BATCH):
            kept = 3 + i
            tokens[i, :kept, 0] = 5
            tokens[i, :kept, 1:] = torch.randint(1, 5, (kept, BASES), generator=g)
        d = torch.rand(BATCH, BATCH, generator=g)
        d = (d + d.T) / 2
        d.fill_diagonal_(0)
        out.append({"tokens": tokens, "unifrac_target": d})
    return out


torch.manual_seed(0)
model = SequenceEncoder(embedding_dim=16, max_bp=BASES, token_limit=TOKEN_LIMIT, asv_num_layers=1, asv_num_heads=2,
                        sample_num_layers=1, sample_num_heads=2, encoder_num_layers=1, encoder_num_heads=2,
                        base_output_dim=BATCH, asv_dropout=0.0, sample_dropout=0.0, encoder_dropout=0.0)
trainer = Trainer(model, MultiTaskLoss(penalty=1.0, nuc_penalty=0.0),
                  optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3), device="cpu")
losses = trainer.train_epoch(torch.utils.data.DataLoader(batches(args.steps), batch_size=None))
print({k: round(float(v), 6) for k, v in losses.items()})
