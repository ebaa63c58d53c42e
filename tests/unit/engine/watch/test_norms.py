"""norms.state_sums: the parameter and optimizer-state check, a parallel sum per large CPU tensor; norms.l2_norms:
the gradients' norms, exact (torch's own, which clipping reuses) or by a parallel dot product for large tensors."""

import math

import torch
from torch import nn

from debug_nan.engine.watch.norms import BIG, l2_norms, state_sums
from debug_nan.engine.watch.watch import Watch


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


def test_inexact_norms_are_dot_products_for_large_contiguous_cpu_tensors_only():
    g = torch.Generator().manual_seed(0)
    big = torch.randn(BIG * 2, generator=g)
    tensors = [big, torch.randn(8, 8, generator=g), big.view(2, BIG).t(), big.half(), big.double()]
    exact = l2_norms(tensors)
    fast = l2_norms(tensors, exact=False)
    assert exact[0].item() == torch._foreach_norm([big])[0].item()  # exact: torch's own kernel, bit for bit
    for i in (1, 2, 3):  # small, non-contiguous, fp16: the same kernel as the exact path
        assert fast[i].item() == exact[i].item()
    for i in (0, 4):  # the dot product: the same norm up to the order of the sums
        assert fast[i].item() == torch.dot(tensors[i], tensors[i]).sqrt().item()
        assert math.isclose(fast[i].item(), exact[i].item(), rel_tol=1e-5)
    assert fast[4].dtype == torch.float64 and fast[3].dtype == torch.float32


def test_inexact_norms_keep_nan_and_inf_of_either_sign():
    for bad, expect in ((math.nan, math.isnan), (-math.inf, math.isinf), (math.inf, math.isinf)):
        t = torch.ones(BIG)
        t[123] = bad
        assert expect(l2_norms([t], exact=False)[0].item())
    huge = torch.full((BIG,), 1e20)  # finite, but the square overflows: +Inf, which the watch's second look settles
    assert l2_norms([huge], exact=False)[0].item() == math.inf
