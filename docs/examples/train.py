"""A plain PyTorch training loop with a planted NaN, for trying `debug-nan run` (docs/run.md).

    python docs/examples/train.py            # prints `loss nan` from step 3 on
    python docs/examples/train.py --fixed    # the same loop, clean

A tiny attention model pools each sequence with a masked softmax. Step 3's batch holds one sequence that is all
padding, so its softmax row has every key masked: softmax of an all -inf row is 0/0 = NaN.
"""

import argparse

import torch
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=5)
parser.add_argument("--lr", type=float, default=1e-3)
parser.add_argument("--fixed", action="store_true", help="give an all-padding row one key (the fix)")
args = parser.parse_args()


class Pool(nn.Module):
    """Attention pooling over the valid positions of each sequence."""

    def __init__(self, width: int):
        super().__init__()
        self.score = nn.Linear(width, 1)

    def forward(self, x, valid):
        scores = self.score(x).squeeze(-1).masked_fill(~valid, float("-inf"))
        if args.fixed:
            scores = scores.masked_fill(~valid.any(-1, keepdim=True), 0.0)
        weights = torch.softmax(scores, dim=-1)
        return (weights.unsqueeze(-1) * x).sum(1)


class Net(nn.Module):
    def __init__(self, vocab: int = 16, width: int = 32):
        super().__init__()
        self.embed = nn.Embedding(vocab, width, padding_idx=0)
        self.pool = Pool(width)
        self.head = nn.Linear(width, 1)

    def forward(self, tokens):
        return self.head(self.pool(self.embed(tokens), tokens != 0)).squeeze(-1)


torch.manual_seed(0)
model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
for step in range(1, args.steps + 1):
    tokens = torch.randint(1, 16, (8, 12))
    tokens[:, 9:] = 0  # padding
    if step == 3:
        tokens[5] = 0  # a sequence that is all padding
    target = torch.randn(8)
    loss = nn.functional.mse_loss(model(tokens), target)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
