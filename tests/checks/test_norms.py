"""norms.state_sums: the parameter and optimizer-state check, a parallel sum per large CPU tensor."""

import math

import torch
from torch import nn

from debug_nan.checks.norms import BIG, state_sums
from debug_nan.checks.watch import Watch


def test_large_tensors_are_summed_and_small_ones_normed():
    big, small = torch.full((BIG,), 0.5), torch.tensor([3.0, 4.0])
    values = state_sums([big, small, big.half()])
    assert [v.item() for v in values] == [BIG * 0.5, 5.0, BIG * 0.5]
    assert values[2].dtype == torch.float32  # fp16 summed in fp32: 32768 would fit, 65536 * 1.0 would not


def test_a_non_finite_element_of_a_large_tensor_trips_and_a_sum_overflow_does_not():
    model = nn.Linear(BIG // 64, 64, bias=False)  # 65536 weights: summed
    watch = Watch(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with torch.no_grad():
        model.weight.fill_(3e38)  # finite, but the sum overflows float32
    watch.watch_params()
    result = watch.sync()
    assert math.isinf(result.values("param")["weight"]) and result.first_harm() is None  # the second look
    with torch.no_grad():
        model.weight.fill_(1.0)
        model.weight[5, 7] = -math.inf
    watch.watch_params()
    harm = watch.sync().first_harm()
    assert (harm.kind, harm.name) == ("param", "weight")


def test_infinities_of_both_signs_in_a_summed_tensor_read_as_inf_not_nan():
    model = nn.Linear(BIG // 64, 64, bias=False)
    watch = Watch(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with torch.no_grad():
        model.weight[0, 0], model.weight[1, 1] = math.inf, -math.inf  # their sum is NaN; no element is
    watch.watch_params()
    harm = watch.sync().first_harm()
    assert (harm.kind, harm.name, harm.value) == ("param", "weight", math.inf)
