"""drivers/eval_forwards.py: which outputs of a forward outside training are harm, read in one pass."""

import math

import torch

from debug_nan.drivers.eval_forwards import harmful_reading


def test_a_finite_output_and_a_minus_inf_mask_are_not_harm():
    logits = torch.randn(4, 5)
    assert harmful_reading(logits) is None
    assert harmful_reading({"logits": logits.masked_fill(torch.eye(4, 5, dtype=torch.bool), -math.inf)}) is None
    assert harmful_reading((torch.arange(3), "text")) is None  # no floating tensor


def test_nan_and_plus_inf_are_harm_nan_first():
    clean, nan, inf = torch.zeros(3), torch.tensor([0.0, math.nan]), torch.tensor([math.inf, 1.0])
    assert math.isnan(harmful_reading([clean, inf, nan]))
    assert harmful_reading([clean, inf]) == math.inf
    both = torch.tensor([math.inf, -math.inf])  # their sum is NaN: looked at element by element, +inf is harm
    assert harmful_reading(both) == math.inf


def test_finite_values_whose_sum_overflows_are_not_harm():
    big = torch.full((8,), 3e38)  # each finite; their float32 sum is +inf
    assert harmful_reading(big) is None
    assert harmful_reading(big.to(torch.bfloat16)) is None


def test_an_output_the_script_gave_up_on_counts_minus_inf_too():
    masked = torch.tensor([1.0, -math.inf])
    assert harmful_reading(masked) is None
    assert harmful_reading(masked, minus_inf_is_harm=True) == math.inf
    assert math.isnan(harmful_reading([masked, torch.tensor([math.nan])], minus_inf_is_harm=True))
