"""drivers/trainer/sharding.py without ranks: a full optimizer state keyed by parameter number is re-keyed by the
parameters' names for torch's sharded loader (through torchrun: tests/e2e/ddp/test_fsdp_checkpoint.py)."""

import pytest
import torch
from torch import nn

from debug_nan.drivers.trainer.sharding import keyed_by_name


def model_and_optimizer():
    model = nn.Sequential(nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1))
    decay = [model[0].weight, model[2].weight]
    optimizer = torch.optim.AdamW([{"params": decay}, {"params": [model[0].bias, model[2].bias], "weight_decay": 0}])
    model(torch.ones(4, 2)).sum().backward()
    optimizer.step()
    return model, optimizer


def test_numbers_become_the_names_of_the_parameters_they_stand_for_in_group_order():
    model, optimizer = model_and_optimizer()
    saved = optimizer.state_dict()
    named = keyed_by_name(model, optimizer, saved)
    assert [g["params"] for g in named["param_groups"]] == [["0.weight", "2.weight"], ["0.bias", "2.bias"]]
    assert named["param_groups"][1]["weight_decay"] == 0 and set(named["state"]) == {"0.weight", "2.weight",
                                                                                      "0.bias", "2.bias"}
    # the state of `2.bias` is the state of the parameter the number stood for (its moments have its shape)
    assert named["state"]["2.bias"]["exp_avg"] is saved["state"][3]["exp_avg"]
    assert named["state"]["0.weight"]["exp_avg"].shape == (3, 2)
    assert keyed_by_name(model, optimizer, named) is named  # already by name: as it is


def test_a_checkpoint_of_another_parameter_count_is_refused():
    model, optimizer = model_and_optimizer()
    saved = optimizer.state_dict()
    saved["param_groups"][1]["params"] = saved["param_groups"][1]["params"][:1]
    with pytest.raises(ValueError, match="holds 3 parameters, the run's 4"):
        keyed_by_name(model, optimizer, saved)
