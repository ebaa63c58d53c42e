"""Task plug-ins for "the debug run is the user's run": each one trains exactly as its own loop would.

    debug-nan --task tests/support/tasks/users_run.py:sgd_lr5 --max-steps 20 --explosion-threshold 1e300
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

ROOT = str(Path(__file__).resolve().parents[3])  # the repository: a --task file is loaded by path, maybe elsewhere
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests.support.models import D, MaskedAttention  # noqa: E402


def _regression(seed: int, n: int = 16, scale: float = 1.0) -> list[dict]:
    g = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(n, D, generator=g), "y": scale * torch.randn(n, generator=g)}]


def _mse(model, batch):
    return F.mse_loss(model(batch["x"]).squeeze(-1), batch["y"])


def sgd_lr5():
    """Plain SGD at lr 5 on a linear regression: diverges, the loss overflowing float32 after a dozen steps."""
    torch.manual_seed(0)
    return SimpleNamespace(model=nn.Linear(D, 1), batches=_regression(12), loss=_mse,
                           optimizer=lambda params: torch.optim.SGD(params, lr=5.0))


def scheduled_and_clipped():
    """The task's own recipe: SGD, lr halved every step, gradients clipped to a norm of 0.5."""
    torch.manual_seed(0)
    return SimpleNamespace(model=nn.Linear(D, 1), batches=_regression(13, scale=20.0), loss=_mse,
                           optimizer=lambda params: torch.optim.SGD(params, lr=0.1),
                           scheduler=lambda opt: torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5),
                           max_grad_norm=0.5)


class FrozenNorm(nn.Module):
    """A linear layer, a BatchNorm whose running variance went negative (a corrupted statistic), a head. In
    training mode BatchNorm uses the batch's statistics (finite); in eval mode it divides by sqrt(var < 0)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(D, 4)
        self.bn = nn.BatchNorm1d(4)
        self.out = nn.Linear(4, 1)
        with torch.no_grad():
            self.bn.running_var[1] = -1.0

    def forward(self, x):
        return self.out(self.bn(self.inp(x))).squeeze(-1)


class FrozenByTrain(FrozenNorm):
    """The usual way to freeze BatchNorm: train() keeps it in eval mode."""

    def train(self, mode: bool = True):
        super().train(mode)
        self.bn.eval()
        return self


def frozen_batchnorm():
    """The factory froze the BatchNorm (eval mode) before handing the model over."""
    torch.manual_seed(0)
    model = FrozenNorm()
    model.bn.eval()
    return SimpleNamespace(model=model, batches=_regression(14), loss=_mse)


def frozen_batchnorm_by_train():
    torch.manual_seed(0)
    return SimpleNamespace(model=FrozenByTrain(), batches=_regression(14), loss=_mse)


def mutating_loss():
    """The loss normalises the batch's weights in place; sample 2 has no weight at all, so its row is 0 / 0."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(15)
    w = torch.rand(4, 5, generator=g)
    w[2] = 0.0
    batches = [{"x": torch.randn(4, 5, D, generator=g), "w": w, "y": torch.randn(4, generator=g),
                "sample_ids": ["a", "b", "c", "d"]}]

    def loss(model, batch):
        batch["w"].div_(batch["w"].sum(1, keepdim=True))  # normalise the weights (in place)
        pred = (model(batch["x"]).squeeze(-1) * batch["w"]).sum(1)
        return F.mse_loss(pred, batch["y"])

    return SimpleNamespace(model=nn.Linear(D, 1), batches=batches, loss=loss)


class Encoder(nn.Module):
    """x [B, L, D], valid [B, L] -> [B, L]: the shared MaskedAttention, then a head (no embedding)."""

    def __init__(self):
        super().__init__()
        self.attn = MaskedAttention()
        self.head = nn.Linear(D, 1)

    def forward(self, x, valid):
        return self.head(self.attn(x, valid)).squeeze(-1)


def _masked(empty: bool) -> list[dict]:
    g = torch.Generator().manual_seed(16)
    valid = torch.ones(4, 6, dtype=torch.bool)
    valid[:, 4:] = False
    if empty:
        valid[2] = False  # sample 2: every key masked
    return [{"x": torch.randn(4, 6, D, generator=g), "valid": valid, "y": torch.randn(4, 6, generator=g)}]


def _masked_loss(model, batch):
    return (((model(batch["x"], batch["valid"]) - batch["y"]) ** 2) * batch["valid"]).mean()


def compiled_healthy():
    torch.manual_seed(0)
    return SimpleNamespace(model=torch.compile(Encoder()), batches=_masked(False), loss=_masked_loss)


def compiled_broken():
    torch.manual_seed(0)
    return SimpleNamespace(model=torch.compile(Encoder()), batches=_masked(True), loss=_masked_loss)


def replay_out_of_memory():
    """The run's loss is NaN (0 / 0); the replay of that micro-batch runs out of memory."""
    calls = []

    def loss(model, batch):
        calls.append(1)
        if len(calls) == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 8.00 GiB. GPU 0 has a total "
                                         "capacity of 79.1 GiB of which 1.2 GiB is free.")
        return (model(batch["x"]) * 0).sum() / 0

    torch.manual_seed(0)
    return SimpleNamespace(model=nn.Linear(D, 1), batches=_regression(17), loss=loss)
