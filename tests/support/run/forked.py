"""A script that trains in a forked worker (multiprocessing's "fork" start method), as a user writes it:

    python forked.py early      the worker is forked before the parent creates any optimizer, and trains 4 steps;
                                its batch of step 3 has targets ~1e20 (its squared error overflows)
    python forked.py late       the parent trains its 4 steps first, then forks the worker, which trains

The worker prints a line per step; the parent exits with the worker's exit code.
"""

import multiprocessing
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root, for its test models

from tests.support import models


def train(model, who: str, big_at=()) -> None:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step, batch in enumerate(models.batches(n=4, big_at=big_at), start=1):
        loss = models.regression_loss(model, batch)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(f"{who} step {step} loss {loss.item():.6f}", flush=True)


if __name__ == "__main__":
    torch.manual_seed(0)
    model = models.Net()
    early = sys.argv[1] == "early"
    if not early:
        train(model, "parent")
    worker = multiprocessing.get_context("fork").Process(target=train, args=(model, "worker", (2,) if early else ()))
    worker.start()
    worker.join()
    sys.exit(worker.exitcode)
