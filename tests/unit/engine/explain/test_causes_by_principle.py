"""Causes by what an op can return at finite inputs (engine/explain/causes/principles.py): an op without a pole can only
overflow, whatever float64 says; an op no rule lists gets its cause from its inputs."""

import pytest
import torch
from torch import nn

from debug_nan.engine.explain.causes.principles import has_no_pole, zero_slices
from tests.unit.engine.explain.test_diagnose import traced


def test_exp_past_float64_is_still_an_overflow():
    origin, (cause, explanation, _) = traced(lambda: torch.tensor([1.0, 800.0]).exp())
    assert origin.op == "aten.exp.default" and cause == "overflow"
    assert "no pole at finite inputs" in explanation and "about 10^347" in explanation


def test_a_sum_that_overflows_while_the_exact_result_fits_is_an_intermediate_overflow():
    x = torch.tensor([[3e38, 3e38, -3e38]])
    _, (cause, explanation, _) = traced(lambda: x.sum(1))
    assert cause == "overflow" and "an intermediate" in explanation and "3e+38 recomputed in float64" in explanation


@pytest.mark.parametrize("old_api", [False, True])
def test_weight_norm_of_a_zero_row_is_zero_over_zero(old_api):
    torch.manual_seed(0)
    if old_api:
        layer = nn.utils.weight_norm(nn.Linear(3, 2))
        with torch.no_grad():
            layer.weight_v[0] = 0.0
    else:
        layer = nn.utils.parametrizations.weight_norm(nn.Linear(3, 2))
        with torch.no_grad():
            layer.parametrizations.weight.original1[0] = 0.0
    origin, (cause, explanation, _) = traced(lambda: layer(torch.randn(4, 3)))
    assert origin.op == "aten._weight_norm_interface.default" and origin.kind == "nan"
    assert cause == "div_by_zero" and "`v` [2, 3] has 1 all-zero slices along dim 0 (of 2)" in explanation


def test_pole_free_families():
    class E:
        scalars, inputs = {"exponent": 2.0}, []
    assert has_no_pole("exp", E) and has_no_pole("_foreach_exp_", E) and has_no_pole("pow", E)
    E.scalars = {"exponent": -1.0}
    assert not has_no_pole("pow", E) and not has_no_pole("log", E) and not has_no_pole("special_zeta", E)


def test_zero_slices():
    assert zero_slices(torch.zeros(3)) == (1, 1)
    assert zero_slices(torch.tensor([[0.0, 0.0], [1.0, 0.0]])) == (1, 2)
    assert zero_slices(torch.ones(2, 2)) is None and zero_slices(torch.tensor([0.0, 1.0])) is None
