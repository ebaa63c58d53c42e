"""Provenance under the Tracer: the origin of a harmed value is the earliest origin in ITS lineage."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from debug_nan.engine.explain.diagnose import diagnose
from debug_nan.engine.trace.tracer import Tracer
from tests.support import scenarios

D = 4


@pytest.fixture
def model():
    torch.manual_seed(0)
    return nn.Linear(D, D)


def test_views_keep_the_lineage_and_a_finite_rewrite_clears_it(model):
    with Tracer(model) as tr:
        a = torch.tensor([0.0, 1.0, 2.0, 3.0])
        b = a.log()  # -inf at 0: an Inf origin
        view = b.view(2, 2)[0]
        assert tr.origin_of(view).op == "aten.log.default"
        assert tr.origin_of(view).kind == "inf" and not tr.origin_of(view).deliberate
        assert tr.origin_of(b.view(2, 2)[1]) is None  # a finite view of the same storage carries nothing
        b.clamp_(min=-5.0)  # in place, the whole storage finite again
        assert tr.lineage.get(b) is None and tr.origin_of(view) is None


def test_partial_in_place_writes_keep_the_rest_of_the_storage(model):
    with Tracer(model) as tr:
        b = torch.tensor([0.0, 1.0]).log()
        buf = torch.zeros(4)
        buf[:2].add_(b)  # -inf enters half of buf
        buf[2:].mul_(2.0)  # a finite write elsewhere in the storage: buf still holds the -inf
        assert tr.origin_of(buf).op == "aten.log.default"
        buf[:2].zero_()  # the only non-finite region rewritten: the storage is finite, its lineage ends
        assert tr.lineage.get(buf) is None


def test_out_and_saved_for_backward_tensors_carry_the_lineage(model):
    w = torch.full((3,), 50.0, requires_grad=True)
    with Tracer(model) as tr:
        dst = torch.empty(2)
        torch.div(torch.tensor([1.0, 0.0]), 0.0, out=dst)  # out= op: 1/0 = inf, 0/0 = NaN
        assert tr.origin_of(dst).op == "aten.div.out" and diagnose(tr.origin_of(dst))[0] == "div_by_zero"
        h = torch.exp(w * 2.0)  # e^100 overflows float32: an Inf origin whose output autograd saves
        h.sum().backward()  # ExpBackward multiplies by the saved result: the gradient is Inf
    origin = tr.origin_of(w.grad)
    assert origin.op == "aten.exp.default" and origin.phase == "loss"
    assert diagnose(origin)[0] == "overflow"


def test_softmax_of_a_fully_masked_row_is_the_nan_origin_not_the_mask(model):
    scores = torch.randn(2, 3, 3)
    valid = torch.ones(2, 3, dtype=torch.bool)
    valid[1] = False  # every key of sample 1 masked
    with Tracer(model) as tr:
        masked = scores.masked_fill(~valid[:, None, :], float("-inf"))
        loss = torch.softmax(masked, dim=-1).sum()
    origin = tr.origin_of(loss)
    assert origin.op == "aten._softmax.default" and origin.kind == "nan"
    [mask] = list(origin.inf_sources)
    assert mask.op == "aten.masked_fill.Scalar" and mask.deliberate and mask.kind == "inf"
    assert diagnose(origin)[0] == "all_masked_softmax"


def test_deliberate_masks_that_never_reach_harm_are_nothing(model):
    scores = torch.randn(2, 3, 3)
    valid = torch.ones(2, 3, dtype=torch.bool)
    valid[:, 2] = False  # ordinary padding: every row keeps keys
    with Tracer(model) as tr:
        loss = torch.softmax(scores.masked_fill(~valid[:, None, :], float("-inf")), dim=-1).sum()
    assert torch.isfinite(loss) and tr.origin_of(loss) is None
    assert [e.op for e in tr.origins] == ["aten.masked_fill.Scalar"]


def test_nanmean_of_intentional_nan_has_no_origin(model):
    x = torch.randn(4, 3, requires_grad=True)
    pad = torch.zeros(4, 3, dtype=torch.bool)
    pad[:, 2] = True
    with Tracer(model) as tr:
        values = torch.where(pad, torch.full_like(x, float("nan")), x)  # padding set to NaN on purpose
        loss = values.nanmean()
        loss.backward()
    assert tr.first is not None and tr.first.op == "aten.full_like.default"  # a birth in time...
    assert torch.isfinite(loss) and tr.origin_of(loss) is None  # ...that never reaches harm
    assert torch.isfinite(x.grad).all() and tr.origin_of(x.grad) is None


def test_nan_hidden_by_where_in_forward_leaks_into_gradients_from_the_forward_op(model):
    x = torch.tensor([-1.0, 4.0, -9.0, 16.0], requires_grad=True)
    with Tracer(model) as tr:
        safe = torch.where(x >= 0, torch.sqrt(x), torch.zeros_like(x))  # sqrt(-1) = NaN, "hidden" by where
        loss = safe.sum()
        assert torch.isfinite(loss) and tr.origin_of(loss) is None
        loss.backward()  # SqrtBackward divides by the saved NaN result: 0 / NaN = NaN
    assert int(torch.isnan(x.grad).sum()) == 2
    origin = tr.origin_of(x.grad)
    assert (origin.op, origin.phase, origin.kind) == ("aten.sqrt.default", "loss", "nan")
    assert diagnose(origin)[0] == "invalid_domain"


def test_inf_hidden_by_where_is_the_origin_of_the_backward_nan_at_the_same_point(model):
    """log(0) = -inf hidden by where: the gradients' NaN is born in LogBackward (0 / 0 at the same x = 0); the
    forward log that met that point first is the origin, as in the hidden_by_where scenario."""
    x = torch.tensor([0.0, 1.0, 2.0], requires_grad=True)
    with Tracer(model) as tr:
        torch.where(x > 0, torch.log(x), torch.zeros_like(x)).sum().backward()
    origin = tr.origin_of(x.grad)
    assert (origin.op, origin.phase, origin.kind) == ("aten.log.default", "loss", "inf")
    assert diagnose(origin)[0] == "log_of_nonpositive"
    nan_birth = tr.origins[-1]
    assert (nan_birth.phase, nan_birth.backward_node, nan_birth.kind) == ("backward", "LogBackward0", "nan")
    assert nan_birth.forward_origin is origin
    cause, explanation, _ = diagnose(nan_birth)
    assert cause == "grad_at_singularity" and "saved forward self is 0 at 1 of 3 positions" in explanation


def test_of_two_independent_births_the_one_that_reaches_the_loss(model):
    with Tracer(model) as tr:
        unused = torch.log(torch.zeros(3))  # born first, never used again
        reached = torch.tensor([1.0, 0.0]) / torch.tensor([0.0, 0.0])  # born second: 1/0 and 0/0
        loss = reached.sum()
    assert tr.first.op == "aten.log.default" and torch.isinf(unused).all()
    origin = tr.origin_of(loss)
    assert origin.op == "aten.div.Tensor" and origin.kind == "nan" and origin.seq > tr.first.seq


def test_nan_and_inf_lineages_stay_apart(model):
    with Tracer(model) as tr:
        big = torch.tensor([3e38, 1.0]) * 10.0  # an overflow: Inf origin
        nan = big - big  # inf - inf: a NaN origin fed by that Inf
        both = torch.cat([nan, big])
    assert tr.origin_of(big).op == "aten.mul.Tensor"  # Inf only: the Inf origin
    assert tr.origin_of(nan).op == "aten.mul.Tensor"  # NaN: the overflow that fed inf - inf is the root
    assert tr.origin_of(both).op == "aten.mul.Tensor"
    nan_origin = tr.origins[-1]
    assert nan_origin.op == "aten.sub.Tensor" and [e.op for e in nan_origin.inf_sources] == ["aten.mul.Tensor"]
    cause, explanation, _ = diagnose(nan_origin)
    assert cause == "inf_arithmetic" and "The Inf came from aten.mul.Tensor" in explanation
    assert "exceeds the float32 maximum" in explanation


def test_an_inf_harm_prefers_a_real_birth_over_an_earlier_mask(model):
    with Tracer(model) as tr:
        mask = torch.zeros(3).masked_fill(torch.tensor([True, False, False]), float("-inf"))  # first in time
        over = torch.tensor([1e30, 1.0, 1.0]) ** 2  # an overflow, later
        harm = torch.cat([mask, over]).abs().max()  # +inf, from both
    assert torch.isinf(harm)
    assert tr.origin_of(harm).op == "aten.pow.Tensor_Scalar"
    assert tr.origin_of(mask).deliberate and tr.origin_of(mask).seq < tr.origin_of(harm).seq


def test_rl_masked_logits_reaching_the_loss_is_the_mask(model):
    logits = torch.randn(4, 5)
    invalid = torch.zeros(4, 5, dtype=torch.bool)
    invalid[:, 3:] = True
    actions = torch.tensor([0, 1, 2, 4])  # the last sample took an invalid action
    with Tracer(model) as tr:
        logp = F.log_softmax(logits.masked_fill(invalid, float("-inf")), dim=-1)
        loss = -logp.gather(1, actions[:, None]).mean()
    assert torch.isinf(loss)
    origin = tr.origin_of(loss)
    assert origin.op == "aten.masked_fill.Scalar" and origin.deliberate
    assert diagnose(origin)[0] == "masked_value_used"


def test_marked_batch_tensor_ends_the_lineage(model):
    x = torch.randn(3, D)
    x[1, 2] = float("nan")
    with Tracer(model) as tr:
        marked = tr.mark(x, "batch `x`", "data")
        assert tr.mark(torch.ones(2), "batch `y`") is None  # finite: nothing to mark
        loss = model(x).sum()
    origin = tr.origin_of(loss)
    assert origin is marked and (origin.phase, origin.label, origin.kind) == ("data", "batch `x`", "nan")
    cause, explanation, _ = diagnose(origin)
    assert cause == "nonfinite_input" and "1 NaN" in explanation


def test_unmarked_non_finite_parameter_becomes_an_origin_where_first_used(model):
    with torch.no_grad():
        model.weight[0, 0] = float("inf")
    with Tracer(model) as tr:
        loss = model(torch.ones(2, D)).sum()
    origin = tr.origin_of(loss)
    assert origin.label == "parameter `weight`" and origin.phase == "optimizer" and not origin.deliberate
    assert diagnose(origin)[0] == "nonfinite_parameter"


def test_a_parents_own_op_upstream_of_a_child(model):
    class Rbf(nn.Module):
        def forward(self, d):
            return torch.exp(-d)

    class Parent(nn.Module):
        def __init__(self):
            super().__init__()
            self.rbf = Rbf()

        def forward(self, x):
            d = torch.log(x)  # the parent's own op, upstream of the child call: log(0) = -inf
            return self.rbf(d)

    class Root(nn.Module):
        def __init__(self):
            super().__init__()
            self.enc = Parent()

        def forward(self, x):
            return self.enc(x)

    root = Root()
    with Tracer(root) as tr:
        loss = root(torch.tensor([0.0, 1.0])).sum()  # exp(inf) = inf reaches the loss
    origin = tr.origin_of(loss)
    assert (origin.op, origin.phase, origin.module, origin.module_type) == ("aten.log.default", "forward", "enc",
                                                                           "Parent")


def test_optimizer_step_origin_and_the_parameters_it_reached():
    torch.manual_seed(0)
    model = nn.Linear(D, 1)
    unused = nn.Parameter(torch.ones(1))
    opt = torch.optim.Adam([*model.parameters(), unused], lr=1e-2, eps=0.0)
    (model(torch.randn(3, D)).sum() + 0.0 * unused.sum()).backward()  # unused's gradient is exactly 0
    with Tracer(model) as tr:
        tr.phase_override = "optimizer"
        assert tr.mark_tree({"w": model.weight, "u": unused}, "parameter", "optimizer") == []  # all finite
        opt.step()  # Adam with eps=0: 0 / (sqrt(0) + 0) = NaN for `unused`
    named = {"weight": model.weight, "bias": model.bias, "unused": unused,
             **{f"unused {k}": v for k, v in opt.state[unused].items()}}
    origin = tr.origin_of(list(named.values()))
    assert origin.phase == "optimizer" and origin.op == "aten.addcdiv_.default" and origin.kind == "nan"
    assert tr.reached(origin, named) == ["unused"]
    assert diagnose(origin)[0] == "nonfinite_parameter"


def test_mark_tree_labels_each_tensor_by_its_path(model):
    batch = {"x": torch.randn(2, D), "extra": [torch.tensor([float("inf")]), torch.ones(1)]}
    with Tracer(model) as tr:
        [mark] = tr.mark_tree(batch, "batch", "data")
        loss = model(batch["x"]).sum() + batch["extra"][0].sum()
    assert mark.label == "batch `extra[0]`" and tr.origin_of(loss) is mark


def test_fp16_overflow_upstream_of_a_nan_is_the_origin():
    """Autocast fp16 (the fp16_overflow scenario): `proj` overflows (Inf), `out` makes inf - inf (NaN) in its
    matmul, the loss is NaN. The overflow that fed the NaN is the root."""
    task = scenarios.fp16_overflow()
    with Tracer(task.model) as tr:
        with torch.autocast("cpu", dtype=torch.float16):
            loss = task.loss(task.model, task.batches[0])
    assert torch.isnan(loss)
    origin = tr.origin_of(loss)
    assert (origin.op, origin.module, origin.kind) == ("aten.addmm.default", "proj", "inf")
    assert diagnose(origin)[0] == "overflow"
    [nan_birth] = [e for e in tr.origins if e.kind == "nan"]
    assert nan_birth.module == "out" and list(nan_birth.inf_sources) == [origin]


def _rms(x: torch.Tensor) -> torch.Tensor:
    """An RMSNorm written by hand: its x.pow(2) overflows float32 once |x| passes 1.8e19, and then
    rsqrt(inf) = 0 makes the output finite again."""
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


def test_a_forward_inf_made_finite_again_is_the_origin_of_the_backward_birth_it_led_to(model):
    """A residual stream at 3.7e19 reaches a norm: the forward x.pow(2) is +inf, the norm's output 0 (finite, so the
    loss is finite), and the backward overflows on the same huge values (a head as large as the stream: the sum of
    grad * x in MulBackward0). The backward birth's inputs were finite but descend from the pow: the pow, earliest
    in the lineage, is the origin; the backward birth is its consequence."""
    stream = torch.full((2, 4), 3.7e19, requires_grad=True)
    with Tracer(model) as tr:
        loss = (_rms(stream) * torch.full((4,), 1e19)).sum()
        assert torch.isfinite(loss)
        loss.backward()
    assert not torch.isfinite(stream.grad).all()
    origin = tr.origin_of(stream.grad)
    assert (origin.op, origin.phase, origin.kind) == ("aten.pow.Tensor_Scalar", "loss", "inf")
    later = tr.consequence
    assert later is not None and later.phase == "backward" and later.seq > origin.seq
    assert origin in later.ancestors
    assert diagnose(origin)[0] == "overflow"


def test_a_finite_value_of_a_mask_does_not_make_the_mask_the_origin(model):
    """Descent through finite values leaves deliberate Infs out: a padded softmax (finite) then a real overflow
    downstream names the overflow, and the mask is no ancestor of it; a real birth upstream is."""
    scores = torch.randn(2, 3)
    with Tracer(model) as tr:
        probs = torch.softmax(scores.masked_fill(torch.tensor([False, False, True]), float("-inf")), dim=-1)
        big = (probs + 1.0) * 3e38  # a real overflow from finite values that descend from the mask
        healed = torch.exp(torch.tensor([100.0])).reciprocal()  # exp overflows (a real birth), 1/inf = 0
        bigger = (probs + healed + 1.0) * 3e38
    origin = tr.origin_of(big)
    assert origin.op == "aten.mul.Tensor" and not origin.deliberate and tr.consequence is None
    assert origin.ancestors == []
    later = tr.origin_of(bigger)
    assert later.op == "aten.exp.default" and tr.consequence.op == "aten.mul.Tensor"


def test_an_inf_that_only_feeds_a_boolean_mask_is_not_an_ancestor(model):
    """isfinite() of a value reads it, but no value of the Inf flows on: a later birth is its own origin."""
    with Tracer(model) as tr:
        keep = torch.isfinite(torch.tensor([1.0, 0.0]).reciprocal())  # 1/0 = inf, then a bool mask
        out = torch.where(keep, torch.tensor([3e38, 3e38]) * 2.0, 0.0)
    origin = tr.origin_of(out)
    assert origin.op == "aten.mul.Tensor" and origin.ancestors == []
