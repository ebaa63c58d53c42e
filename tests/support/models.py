"""The tiny models of the test suite, written once: every test, --task plug-in and user-like script that trains the
masked-attention net (or the Adam eps=0 gate) imports it from here, so a finding through one entry point (the CLI's
--task, `debug-nan run`, the Monitor, Lightning, the HF Trainer, torchrun) can be compared with another's for the
same model and the same numbers.

D = 8 features throughout. Seeded with torch.manual_seed(0) before construction, every copy has the same weights.

    Net(classes=1)      x [B, L, D], valid [B, L] bool -> [B, L] (classes=1) or logits [B, L, classes]:
                        embed (Linear D->D) -> attn (MaskedAttention) -> head (Linear D->classes); 225 parameters
                        with classes=1. A query row whose keys are all masked gives NaN in attn's softmax.
    MaskedAttention     x [B, L, D], valid [B, L] -> [B, L, D]: single head, qk = Linear(D, 2D), keys masked with -inf
    batches(...)        n micro-batches {x [4, 6, D], valid [4, 6], y [4, 6]} (+ label [4, 6], sample_ids) with the
                        bugs planted where asked
    Gated               x [B, D] -> [B]: main = Linear(D, 1) plus 0 * unused_scale (a parameter whose gradient is 0:
                        Adam with eps=0 divides 0 by 0 in its update); 10 parameters
"""

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
    """x [B, L, D], valid [B, L] -> per-slot scores [B, L], or class logits [B, L, 3] with classes=3. The Lightning
    test modules inherit it, so parameter and module names are the same through every entry point."""

    def __init__(self, classes: int = 1):
        super().__init__()
        self.embed = nn.Linear(D, D)
        self.attn = MaskedAttention()
        self.head = nn.Linear(D, classes)

    def forward(self, x, valid):
        return self.head(self.attn(self.embed(x), valid)).squeeze(-1)


def batches(n=8, empty_at=(), big_at=(), unlabelled_at=(), seed=0, labels=False, sample_ids=False):
    """n batches {x [4, 6, D], valid [4, 6], y [4, 6]}: slots 4 and 5 are padding (every row keeps valid keys); in
    batch i (0-based) sample 2 has no valid key when i is in empty_at, the targets y are ~1e20 when i is in big_at
    (the squared error overflows float32). labels=True adds label [4, 6] (classes 0..2; all -100, ignored, when i is
    in unlabelled_at), drawn between x and y; sample_ids=True adds sample_ids ["s{i}_{j}"]."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        valid = torch.ones(4, 6, dtype=torch.bool)
        valid[:, 4:] = False
        if i in empty_at:
            valid[2] = False
        batch = {"x": torch.randn(4, 6, D, generator=g), "valid": valid}
        if labels:
            label = torch.randint(0, 3, (4, 6), generator=g)
            if i in unlabelled_at:
                label[:] = -100
            batch["label"] = label
        batch["y"] = torch.randn(4, 6, generator=g) * (1e20 if i in big_at else 1.0)
        if sample_ids:
            batch["sample_ids"] = [f"s{i}_{j}" for j in range(4)]
        out.append(batch)
    return out


def regression_loss(model, batch):
    """The squared error over the valid slots: a masked mean."""
    pred = model(batch["x"], batch["valid"])
    return ((pred - batch["y"]) ** 2 * batch["valid"]).sum() / batch["valid"].sum().clamp_min(1)


def classification_loss(model, batch):
    """Cross-entropy over the labelled slots, as a hand-written masked mean (0 / 0 when no label is kept)."""
    logits = model(batch["x"], batch["valid"])
    keep = (batch["label"] != -100).float()
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, 3), batch["label"].reshape(-1).clamp_min(0),
                                            reduction="none")
    return (nll * keep.reshape(-1)).sum() / keep.sum()


class Gated(nn.Module):
    """x [B, D] -> [B]. A parameter whose gradient is exactly 0: with Adam eps=0 its update is 0/0 in the optimizer
    step."""

    def __init__(self):
        super().__init__()
        self.main = nn.Linear(D, 1)
        self.unused_scale = nn.Parameter(torch.ones(1))

    def forward(self, x):
        return self.main(x).squeeze(-1) + 0.0 * self.unused_scale
