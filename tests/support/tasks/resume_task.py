"""A --task whose NaN depends on how far training got: the weight grows every step until log(2 - w x) < 0.

The plain loop in tests/e2e/cli/test_checkpoint.py trains it, saves a checkpoint at step k, and finds the first NaN
loss at step k + j; debug-nan resumed from that checkpoint must report step k + j."""

import torch
from torch import nn

N_BATCHES = 40


def batches() -> list[torch.Tensor]:
    """Micro-batch i: [4, 1] values that vary by batch, so the data order (--skip-batches) matters too."""
    return [torch.full((4, 1), 0.5 + 0.05 * (i % 7)) for i in range(N_BATCHES)]


def make_model() -> nn.Module:
    torch.manual_seed(0)
    model = nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        model.weight.fill_(0.1)
    return model


def loss(model, batch):
    # minimising log(2 - w x) pushes w x towards 2, and past it: log of a negative number, NaN
    return torch.log(2.0 - model(batch)).mean()


def optimizer(params):
    return torch.optim.SGD(params, lr=0.02, momentum=0.9)


def build():
    return {"model": make_model(), "batches": batches(), "loss": loss, "optimizer": optimizer}


def load_checkpoint(path, model, optimizer):
    """A layout of its own: {"weights": ..., "opt": ..., "n": step}."""
    state = torch.load(path, weights_only=True)
    model.load_state_dict(state["weights"])
    optimizer.load_state_dict(state["opt"])
    return state["n"]


def build_custom():
    return {**build(), "load_checkpoint": load_checkpoint}
