"""Tasks that fail in the ways a user's task can (written into a temp folder by the tests)."""
import os
import shutil
import sys
import time

import torch
from torch import nn


class T:
    def __init__(self, model, batches, loss):
        self.model, self.batches, self.loss = model, batches, loss


def _batches(n=4):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(4, 3, generator=g) for _ in range(n)]


def _square(m, b):
    return m(b).pow(2).mean()


def healthy():
    torch.manual_seed(0)
    return T(nn.Linear(3, 1), _batches(), _square)


def removes_path():
    """Deletes $FAULT_PATH (a folder) at the second loss call: the report's or the plot's folder goes away."""
    calls = [0]

    def loss(m, b):
        calls[0] += 1
        if calls[0] == 2:
            shutil.rmtree(os.environ["FAULT_PATH"], ignore_errors=True)
        return _square(m, b)
    return T(nn.Linear(3, 1), _batches(), loss)


def frozen():
    model = nn.Linear(3, 1)
    model.requires_grad_(False)
    return T(model, _batches(), _square)


class Broken:
    def __iter__(self):
        items = [torch.randn(4, 3)]
        for k in range(3):
            yield items[k]


def broken_batches():
    return T(nn.Linear(3, 1), Broken(), _square)


def exits_in_factory():
    sys.exit(3)


def exits_in_loss():
    def loss(m, b):
        sys.exit(3)
    return T(nn.Linear(3, 1), _batches(), loss)


def slow():
    """A step every ~0.1 s, for the signal tests."""
    def loss(m, b):
        time.sleep(0.1)
        return _square(m, b)
    return T(nn.Linear(3, 1), _batches(), loss)


def nan_at_step_2():
    calls = [0]

    def loss(m, b):
        calls[0] += 1
        out = m(b).pow(2).mean()
        return out * float("nan") if calls[0] >= 2 else out
    return T(nn.Linear(3, 1), _batches(), loss)


def interrupted_in_replay():
    """NaN loss at step 2; the pinpoint replay's call of the loss is interrupted (Ctrl-C)."""
    calls = [0]

    def loss(m, b):
        calls[0] += 1
        if calls[0] >= 3:
            raise KeyboardInterrupt
        out = m(b).pow(2).mean()
        return out * float("nan") if calls[0] == 2 else out
    return T(nn.Linear(3, 1), _batches(), loss)


def log_of_negative_in_batch_2():
    """Stateless (replayable): batch 2 holds -3, and the loss takes log(x + 2) of it."""
    batches = _batches()
    batches[1][0, 0] = -3.0

    def loss(m, b):
        return m(b).pow(2).mean() + torch.log(b[0, 0] + 2)
    return T(nn.Linear(3, 1), batches, loss)
