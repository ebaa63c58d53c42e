"""--checkpoint: every layout people save is read (drivers/trainer/checkpoint.py; through the CLI:
tests/e2e/cli/test_checkpoint.py)."""


import pytest
import torch

from debug_nan.drivers.trainer.checkpoint import split_checkpoint
from debug_nan.errors import InputError

# -- bad checkpoints: exit 2, naming what is wrong -------------------------------------------------------------------


def test_layouts_unit():
    sd = {"w": torch.zeros(1)}
    assert split_checkpoint(sd, "p") == {"model": sd}
    parts = split_checkpoint({"model": sd, "scheduler": {"last_epoch": 3}, "grad_scaler": {"scale": 2.0},
                              "global_step": torch.tensor(7)}, "p")
    assert parts["step"] == 7 and parts["scheduler"] == {"last_epoch": 3} and parts["scaler"] == {"scale": 2.0}
    with pytest.raises(InputError, match="`step` is 'x'"):
        split_checkpoint({"model": sd, "step": "x"}, "p")
    with pytest.raises(InputError, match="holds a int"):
        split_checkpoint(3, "p")
