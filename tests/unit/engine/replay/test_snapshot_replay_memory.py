"""The optimizer-phase replay's memory: the tracer judges a multi-tensor optimizer op (foreach / fused AdamW) one
list element at a time, so the copies it makes of the destinations are one tensor's size, not the whole list's,
and the origin is still the op, with evidence about the element that went non-finite."""

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from debug_nan.engine.explain.diagnose import diagnose
from debug_nan.engine.trace.events import split_foreach
from debug_nan.engine.trace.tracer import Tracer
from debug_nan.engine.watch.watch import param_and_state_tensors


class Recorder(TorchDispatchMode):
    """Outside the tracer: sees the ops the tracer runs (the optimizer's, and its own copies)."""

    def __init__(self):
        super().__init__()
        self.list_lengths, self.cloned = [], []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name.split("::")[-1]
        if name.startswith(("_foreach_", "_fused_")) and func._schema.is_mutable:
            self.list_lengths.append(len(args[0]))
        if name == "clone":
            self.cloned.append(args[0].numel())
        return func(*args, **(kwargs or {}))


class Gated(nn.Module):
    """Four parameters; `unused` gets a gradient of exactly 0, so Adam with eps=0 computes 0 / 0 for it."""

    def __init__(self):
        super().__init__()
        self.main = nn.Linear(16, 8)
        self.head = nn.Linear(8, 1)
        self.unused = nn.Parameter(torch.ones(3))

    def forward(self, x):
        return self.head(self.main(x)).squeeze(-1) + 0.0 * self.unused.sum()


def traced_step(kind: str):
    torch.manual_seed(0)
    model = Gated()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, eps=0.0, **{kind: True})
    model(torch.randn(4, 16)).pow(2).mean().backward()
    recorder = Recorder()
    with recorder, Tracer(model) as tracer:
        tracer.phase_override = "optimizer"
        for name, t in param_and_state_tensors(model.named_parameters(), optimizer):
            tracer.mark(t, name, "optimizer")
        optimizer.step()
        named = dict(param_and_state_tensors(model.named_parameters(), optimizer))
        origin = tracer.origin_of(list(named.values()))
    return model, tracer, origin, named, recorder


@pytest.mark.parametrize("kind", ["foreach", "fused"])
def test_multi_tensor_adam_is_judged_one_element_at_a_time(kind):
    model, tracer, origin, named, recorder = traced_step(kind)
    assert recorder.list_lengths and set(recorder.list_lengths) == {1}  # every list op ran on one element
    largest = max(p.numel() for p in model.parameters())
    assert recorder.cloned and max(recorder.cloned) <= largest  # never a copy of a whole list at once
    assert origin is not None and origin.phase == "optimizer" and origin.kind == "nan"
    assert origin.op.startswith("aten._foreach_addcdiv_" if kind == "foreach" else "aten._fused_adam_")
    assert all(t.numel() == 3 for _, t in origin.inputs if t.dim() > 0)  # evidence: the `unused` element only
    assert tracer.reached(origin, named)[0] == "unused"


def test_foreach_addcdiv_evidence_names_the_zero_denominator():
    _, _, origin, _, _ = traced_step("foreach")
    cause, explanation, _ = diagnose(origin)
    assert cause == "nonfinite_parameter"
    assert "the denominator `tensor2[0]` is exactly 0 at 3 of 3 positions (3 of them 0/0 = NaN)" in explanation


def test_split_foreach_slices_lists_and_per_element_scalars_only():
    a, b = [torch.ones(2), torch.ones(3)], [torch.zeros(2), torch.zeros(3)]
    scalars = torch.tensor([0.5, 2.0])
    calls = split_foreach(torch.ops.aten._foreach_addcdiv_.Tensor, (a, b, b, scalars), {})
    assert len(calls) == 2 and calls[1][0][0][0] is a[1] and calls[1][0][3].tolist() == [2.0]
    calls = split_foreach(torch.ops.aten._foreach_mul_.Tensor, (a, torch.tensor(3.0)), {})
    assert calls[0][0][1].dim() == 0  # one factor for every element: kept whole
    calls = split_foreach(torch.ops.aten._foreach_add_.List, (a, b), {"alpha": 2})
    assert calls[0][1] == {"alpha": 2} and calls[0][0][1] == [b[0]]
    assert split_foreach(torch.ops.aten.add_.Tensor, (a[0], b[0]), {}) is None
    assert split_foreach(torch.ops.aten._foreach_add_.List, ([a[0]], [b[0]]), {}) is None  # one element already
