"""A plain PyTorch training loop, as a user writes it (no debug-nan inside): prints its loss every step.

    python plain_loop.py [--bug none|masked|overflow|unlabelled|lr] [--accumulate N] [--steps N] [--lr LR]
"""

import argparse
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root, for its test models

from tests.support import models

parser = argparse.ArgumentParser()
parser.add_argument("--bug", default="none", choices=["none", "masked", "overflow", "unlabelled", "lr"])
parser.add_argument("--accumulate", type=int, default=1)
parser.add_argument("--steps", type=int, default=4)
parser.add_argument("--lr", type=float, default=1e-2)
parser.add_argument("--exit-code", type=int, default=0)
parser.add_argument("--unseeded-noise", action="store_true", help="add noise from the OS: not reproducible")
args = parser.parse_args()

torch.manual_seed(0)
classes = 3 if args.bug == "unlabelled" else 1
model = models.Net(classes)
optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
at = {"masked": {"empty_at": (3,)}, "overflow": {"big_at": (3,)}, "unlabelled": {"unlabelled_at": (3,)}}
data = models.batches(labels=True, **at.get(args.bug, {}))
if args.unseeded_noise:
    noise = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    for batch in data:
        batch["x"] += 1e-3 * torch.randn(batch["x"].shape, generator=noise)
loss_fn = models.classification_loss if args.bug == "unlabelled" else models.regression_loss

done = 0
batch_iter = iter(data * 100)
try:
    while done < args.steps:
        total = 0.0
        for _ in range(args.accumulate):
            loss = loss_fn(model, next(batch_iter)) / args.accumulate
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        done += 1
        print(f"step {done} loss {total:.6f}")
except Exception as exc:  # noqa: BLE001 - a script that swallows its own failures: debug-nan must still stop it
    print(f"training failed: {exc}")
sys.exit(args.exit_code)
