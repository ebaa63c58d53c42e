"""The `--task` twins of the `debug-nan run` test scripts: the same model, batches, loss and optimizer.

    debug-nan --task tests/support/run/tasks.py:masked --max-steps 4 --gradient-accumulation-steps 2
"""

from types import SimpleNamespace

import torch

from tests.support import models

LR = 1e-2


def _task(classes=1, loss=models.regression_loss, lr=LR, **at):
    torch.manual_seed(0)
    return SimpleNamespace(model=models.Net(classes), batches=models.batches(labels=True, **at), loss=loss,
                           optimizer=lambda params: torch.optim.AdamW(params, lr=lr))


def healthy():
    return _task()


def masked():
    return _task(empty_at=(3,))


def overflow():
    return _task(big_at=(3,))


def unlabelled():
    return _task(classes=3, loss=models.classification_loss, unlabelled_at=(3,))


def high_lr():
    return _task(lr=1e3)


def overflow_both():
    """Under torchrun with 2 ranks: batches 4 and 5 are the two ranks' batches of step 3."""
    return _task(big_at=(4, 5))
