"""The watch trips on harm only: what it records, what it calls harm, and the DDP phase codes it computes (on a
fake world; on two real ranks: tests/e2e/ddp/test_watch_ranks.py)."""

import math

import pytest
import torch
from torch import nn

from debug_nan.engine.vocabulary import PHASE_OF_KIND
from debug_nan.engine.watch.phase_codes import ABORT_CODE, CODE_PHASE, EXCEPTION_CODE, PHASE_CODE, host_code
from debug_nan.engine.watch.watch import Watch, l2_norms


class Biased(nn.Module):
    """A linear layer plus a submodule whose output is an additive causal bias full of -inf (a healthy model)."""

    class CausalBias(nn.Module):
        def forward(self, n: int) -> torch.Tensor:
            return torch.full((n, n), float("-inf")).triu(1)

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.bias = self.CausalBias()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scores = self.proj(x) @ x.transpose(-1, -2) + self.bias(x.shape[-2])
        return torch.softmax(scores, dim=-1) @ x


def micro(watch: Watch, model: nn.Module, batch: dict, loss_fn, agree=None, raised=False, abort=False):
    """One watched micro-batch: batch, forward + loss, backward, gradients, the sync."""
    model.zero_grad(set_to_none=True)
    watch.watch_batch(batch)
    loss = loss_fn(model, batch)
    watch.watch_loss(loss)
    loss.backward()
    watch.watch_grads()
    return watch.sync(agree, raised=raised, abort=abort)


def test_deliberate_minus_inf_output_is_recorded_not_harm():
    torch.manual_seed(0)
    model = Biased()
    watch = Watch(model)
    result = micro(watch, model, {"x": torch.randn(2, 5, 4)}, lambda m, b: m(b["x"]).pow(2).mean())
    assert result.first_harm() is None and result.harm() is None
    [seen] = result.nonfinite("forward")
    assert (seen.name, seen.nonfinite, seen.value) == ("bias", "-inf", math.inf)
    assert result.values("forward")["bias"] == math.inf and math.isfinite(result.values("forward")["proj"])
    assert math.isfinite(result.loss()) and set(result.values("grad")) == {"proj.weight", "proj.bias"}


def test_nan_consumed_by_nanmean_is_not_harm_but_nan_reaching_the_loss_is():
    model = nn.Linear(3, 1)
    watch = Watch(model)
    y = torch.tensor([1.0, float("nan"), 2.0, float("nan")])  # NaN padding on purpose
    batch = {"x": torch.randn(4, 3), "y": y}

    def nanmean_loss(m, b):  # the target is the mean of the valid entries (no gradient flows through the NaN)
        return ((m(b["x"]).squeeze(-1) - torch.nanmean(b["y"])) ** 2).mean()

    clean = micro(watch, model, batch, nanmean_loss)
    assert clean.first_harm() is None
    assert [(c.name, c.nonfinite) for c in clean.nonfinite("data")] == [("y", "nan")]
    harmed = micro(watch, model, batch, lambda m, b: ((m(b["x"]).squeeze(-1) - b["y"]) ** 2).mean())
    assert harmed.harm().kind == "loss"
    bad = harmed.first_harm()  # the batch stands for the harm: the earliest possible origin
    assert (bad.kind, bad.name, bad.nonfinite) == ("data", "y", "nan")


def test_nan_hidden_by_where_trips_on_the_gradient():
    """log(0) masked by torch.where: every forward value is finite, the gradient is 0 * inf = NaN."""
    model = nn.Linear(2, 2)
    watch = Watch(model)
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 0.0]]))
        model.bias.zero_()

    def loss(m, b):
        h = m(b["x"])
        return torch.where(h > 0, torch.log(h.abs()), torch.zeros_like(h)).sum()

    result = micro(watch, model, {"x": torch.ones(3, 2)}, loss)
    assert not result.nonfinite("forward") and math.isfinite(result.loss())
    bad = result.first_harm()
    assert bad.kind == "grad" and bad.nonfinite == "nan" and bad.name == "weight"


def test_parameter_and_optimizer_state_checks_name_the_tensor():
    model = nn.Linear(3, 2)
    opt = torch.optim.Adam(model.parameters())
    watch = Watch(model, opt)
    loss_fn = lambda m, b: m(b["x"]).sum()  # noqa: E731
    micro(watch, model, {"x": torch.randn(2, 3)}, loss_fn)
    opt.step()
    with torch.no_grad():
        opt.state[model.bias]["exp_avg_sq"][1] = float("inf")  # the parameter itself stays finite
    watch.watch_params()
    bad = micro(watch, model, {"x": torch.randn(2, 3)}, loss_fn).first_harm()
    assert (bad.kind, bad.name, bad.nonfinite) == ("param", "bias (optimizer exp_avg_sq)", "inf")
    with torch.no_grad():
        opt.state[model.bias]["exp_avg_sq"][1] = 1.0
        model.weight[0, 0] = float("nan")
    watch.watch_params()
    result = micro(watch, model, {"x": torch.randn(2, 3)}, loss_fn)
    assert result.first_harm().name == "weight" and result.first_harm().kind == "param"
    assert result.harm().kind == "param"  # the parameter check comes before this micro-batch's NaN loss


def test_a_norm_that_overflows_with_finite_elements_is_not_harm():
    model = nn.Linear(4, 1, bias=False)
    watch = Watch(model)
    model.weight.grad = torch.full((1, 4), 3e37)  # finite; the L2 sum of squares overflows float32
    norms = watch.watch_grads()
    assert torch.isinf(norms[0])
    result = watch.sync()
    assert result.first_harm() is None and result.values("grad") == {"weight": math.inf}  # history keeps it
    model.weight.grad[0, 2] = float("inf")
    watch.watch_grads()
    assert watch.sync().first_harm().nonfinite == "inf"


def test_half_precision_norms_do_not_overflow_in_their_own_dtype():
    grads = [torch.full((64,), 1000.0, dtype=torch.float16), torch.full((8,), 2.0, dtype=torch.bfloat16),
             torch.ones(3, dtype=torch.float64)]
    norms = l2_norms(grads)
    assert [n.dtype for n in norms] == [torch.float32, torch.float32, torch.float64]
    assert norms[0].item() == pytest.approx(8000.0) and norms[1].item() == pytest.approx(math.sqrt(32))


def test_module_called_twice_keeps_the_largest_and_nan_sticks():
    lin = nn.Linear(2, 2)
    model = nn.Sequential(lin, nn.ReLU(), lin)
    watch = Watch(model)
    with torch.no_grad():
        model(torch.tensor([[1.0, 2.0]]))
        model(torch.tensor([[float("nan"), 0.0]]))
    result = watch.sync()
    assert [c.name for c in result.checks].count("0") == 4 and math.isnan(result.values("forward")["0"])
    assert result.first_harm() is None


def test_phase_codes_derive_from_the_kind_to_phase_map():
    assert all(CODE_PHASE[PHASE_CODE[kind]] == phase for kind, phase in PHASE_OF_KIND.items())
    order = ["abort", "optimizer", "data", "forward", "loss", "exception", "backward"]  # earliest seen first
    codes = {phase: code for code, phase in CODE_PHASE.items()}
    assert [codes[p] for p in order] == sorted(codes.values(), reverse=True)
    assert (CODE_PHASE[ABORT_CODE], CODE_PHASE[EXCEPTION_CODE]) == ("abort", "exception")


class FakeWorld:
    """agree() for a world of one rank: what an all-reduce of this rank's code gives, and how often it ran."""

    def __init__(self):
        self.calls = []

    def __call__(self, code: torch.Tensor) -> torch.Tensor:
        assert code.dim() == 0
        self.calls.append(float(code))
        return code.reshape(1).clone()


@pytest.mark.parametrize("y, raised, abort, code", [
    (1.0, False, False, 0),
    (float("nan"), False, False, PHASE_CODE["data"]),  # the batch held the NaN that reached the loss
    (1.0, True, False, EXCEPTION_CODE),
    (float("nan"), False, True, ABORT_CODE),
])
def test_ddp_phase_codes_ride_in_the_one_sync(y, raised, abort, code):
    model = nn.Linear(3, 1)
    watch = Watch(model)
    world = FakeWorld()
    batch = {"x": torch.randn(4, 3), "y": torch.tensor([y, 0.0, 0.0, 0.0])}
    result = micro(watch, model, batch, lambda m, b: ((m(b["x"]).squeeze(-1) - b["y"]) ** 2).mean(), world,
                   raised, abort)
    assert result.rank_codes == [code] and world.calls == [code]
    assert host_code(result, raised, abort) == code


def test_ddp_codes_settle_an_overflowed_norm_in_a_second_round():
    model = nn.Linear(4, 1, bias=False)
    watch = Watch(model)
    world = FakeWorld()
    model.weight.grad = torch.full((1, 4), 3e37)
    watch.watch_grads()
    result = watch.sync(world)
    assert world.calls == [PHASE_CODE["grad"] + 0.5, 0.0] and result.rank_codes == [0.0]


def test_closed_watch_records_nothing_and_attach_restores_the_hooks():
    model = nn.Sequential(nn.Linear(2, 2), nn.Tanh())
    watch = Watch(model)
    watch.close()
    model(torch.ones(1, 2))
    assert watch.sync().values("forward") == {}
    watch.attach()
    watch.attach()  # idempotent: one hook per module
    model(torch.ones(1, 2))
    # torch.nn's weightless Tanh is not hooked: its output is the root's (""), measured there
    assert sorted(watch.sync().values("forward")) == ["", "0"]
    watch.detailed = True  # --trace-every-step: every module
    model(torch.ones(1, 2))
    assert sorted(watch.sync().values("forward")) == ["", "0", "1"]


def test_parameter_check_follows_state_tensors_that_the_optimizer_replaces():
    """An optimizer that assigns a new state tensor every step (no in-place update): the check reads the new one."""
    model = nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    watch = Watch(model, opt)
    for value in (1.0, 2.0, float("nan")):
        opt.state[model.weight]["velocity"] = torch.full((1, 2), value)
        watch.watch_params()
        result = watch.sync()
        assert result.values("param")["weight (optimizer velocity)"] == pytest.approx(value * math.sqrt(2),
                                                                                        nan_ok=True)
    assert result.first_harm().name == "weight (optimizer velocity)"


def test_a_step_that_leaves_module_outputs_out_registers_no_hook():
    """A hook that returns at once still takes its module off torch's fast call path: none is left registered."""
    model = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 1))
    watch = Watch(model)

    def hooked() -> int:
        return sum(len(m._forward_hooks) for m in model.modules())

    assert hooked() == 3  # the root and both Linears (ReLU has no weights of its own)
    watch.measure_outputs = False
    assert hooked() == 0
    model(torch.ones(2, 3))
    assert watch.sync().segment("forward") is None
    watch.close()
    watch.attach()
    assert hooked() == 0  # attached, but this step measures nothing
    watch.measure_outputs = True
    assert hooked() == 3
    model(torch.ones(2, 3))
    assert len(watch.sync().segment("forward").names) == 3
    watch.measure_outputs = False
    watch.detailed = True  # --trace-every-step hooks every module, every step
    assert hooked() == 4
    watch.detailed = False  # back to this step's schedule: nothing measured
    assert hooked() == 0
    watch.close()
    watch.measure_outputs = True
    assert hooked() == 0  # closed stays closed


def test_a_check_without_a_name_is_shown_as_what_it_is():
    """A lone batch tensor has no key and the root model no path: the log names them, not `` nor `<loss>`."""
    from debug_nan.engine.watch.watch_result import Check

    assert Check("loss", "", float("nan"), "nan").said() == "loss `<loss>` = nan"
    assert Check("data", "", float("inf"), "+inf").said() == "data `<batch>` = inf"
    assert Check("forward", "", float("inf"), "+inf").label == "<model>"
    assert Check("data", "input_ids", 3.0).label == "input_ids"
    assert Check("grad", "0.weight", float("nan"), "nan").said() == "grad `0.weight` = nan"
