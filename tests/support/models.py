"""The models, data and losses of the `debug-nan run` test scripts, shared with their `--task` twins (tasks.py),
so a finding through `run` can be compared with the `--task` finding for the same model."""

import torch
from torch import nn

D = 8


class MaskedAttention(nn.Module):
    """Single-head attention with a key mask [B, L]; no guard against a query row whose keys are all masked."""

    def __init__(self):
        super().__init__()
        self.qk = nn.Linear(D, 2 * D)

    def forward(self, x, valid):
        q, k = self.qk(x).chunk(2, dim=-1)
        scores = (q @ k.transpose(1, 2)) / D ** 0.5
        scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
        return torch.softmax(scores, dim=-1) @ x


class Net(nn.Module):
    """x [B, L, D], valid [B, L] -> per-slot scores [B, L], or class logits [B, L, 3] with classes=3."""

    def __init__(self, classes: int = 1):
        super().__init__()
        self.embed = nn.Linear(D, D)
        self.attn = MaskedAttention()
        self.head = nn.Linear(D, classes)

    def forward(self, x, valid):
        return self.head(self.attn(self.embed(x), valid)).squeeze(-1)


def batches(n=8, empty_at=(), big_at=(), unlabelled_at=(), seed=0):
    """n batches {x [4, 6, D], valid [4, 6], y [4, 6], label [4, 6]}: in batch i (0-based) sample 2 has no valid
    key when i is in empty_at, the targets y are ~1e20 when i is in big_at (the squared error overflows float32),
    every label is -100 (ignored) when i is in unlabelled_at."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        valid = torch.ones(4, 6, dtype=torch.bool)
        valid[:, 4:] = False
        if i in empty_at:
            valid[2] = False
        x = torch.randn(4, 6, D, generator=g)
        label = torch.randint(0, 3, (4, 6), generator=g)
        if i in unlabelled_at:
            label[:] = -100
        out.append({"x": x, "valid": valid, "y": torch.randn(4, 6, generator=g) * (1e20 if i in big_at else 1.0),
                    "label": label})
    return out


def regression_loss(model, batch):
    pred = model(batch["x"], batch["valid"])
    return ((pred - batch["y"]) ** 2 * batch["valid"]).sum() / batch["valid"].sum().clamp_min(1)


def classification_loss(model, batch):
    """Cross-entropy over the labelled slots, as a hand-written masked mean (0 / 0 when no label is kept)."""
    logits = model(batch["x"], batch["valid"])
    keep = (batch["label"] != -100).float()
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, 3), batch["label"].reshape(-1).clamp_min(0),
                                            reduction="none")
    return (nll * keep.reshape(-1)).sum() / keep.sum()
