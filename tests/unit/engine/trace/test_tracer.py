"""The Tracer's mechanics: backward ops' modules, the first-birth API its callers use, bounds, copy-on-write,
complex values, deliberate masks held in buffers, and the built-in model's source lines."""


import pytest
import torch
from torch import nn

from debug_nan.aam.model.attention import SelfAttention
from debug_nan.engine.explain.diagnose import diagnose
from debug_nan.engine.trace.tracer import TAG, StopReplay, Tracer
from debug_nan.frames import short_path


def _graph_tags(root) -> dict[str, set]:
    """Node name -> the module tags of the nodes of that name in the graph behind `root`."""
    out, seen, todo = {}, set(), [root]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        out.setdefault(node.name(), set()).add(node.metadata.get(TAG))
        todo.extend(n for n, _ in node.next_functions)
    return out


class Rbf(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Linear(1, 1)

    def forward(self, d):
        return torch.exp(-self.scale(d.unsqueeze(-1)) ** 2)


class Distances(nn.Module):
    """Pairwise distances in the parent's own body, then a child: sqrt at 0 on the diagonal."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 3)
        self.rbf = Rbf()

    def forward(self, x):
        z = self.proj(x)
        d = ((z[:, None, :] - z[None, :, :]) ** 2).sum(-1).sqrt()  # [B, B], 0 on the diagonal
        return self.rbf(d)


class Root(nn.Module):
    def __init__(self):
        super().__init__()
        self.enc = Distances()

    def forward(self, x):
        return self.enc(x).sum()


def test_backward_op_of_a_parents_own_body_belongs_to_the_parent():
    torch.manual_seed(0)
    root = Root()
    with Tracer(root) as tr:
        loss = root(torch.randn(4, 3))
        assert torch.isfinite(loss)
        loss.backward()
    origin = tr.origin_of([p.grad for p in root.parameters()])
    # sqrt's backward at 0 makes Inf (the gradient reaching the diagonal is not 0); the square's backward then
    # multiplies it by z_i - z_j = 0: the NaN. Both ops are the parent's own, upstream of its child `rbf`; the
    # Inf that fed the NaN is the root.
    assert (origin.phase, origin.backward_node, origin.module, origin.module_type, origin.kind) == (
        "backward", "SqrtBackward0", "enc", "Distances", "inf")
    assert origin.source == f"{short_path(__file__)}:{Distances.forward.__code__.co_firstlineno + 2}"
    assert diagnose(origin)[0] == "grad_at_singularity"
    nan_birth = next(e for e in tr.origins if e.kind == "nan")
    assert (nan_birth.backward_node, nan_birth.module) == ("PowBackward0", "enc")
    assert list(nan_birth.inf_sources) == [origin]
    cause, explanation, suggestions = diagnose(nan_birth)
    assert cause == "inf_arithmetic" and "The Inf came from aten.div.Tensor" in explanation
    assert "Backward of sqrt (SqrtBackward0" in explanation and any("sqrt(x + eps)" in s for s in suggestions)


def test_attention_backward_nodes_carry_the_attention_module():
    torch.manual_seed(0)

    class Wrap(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = SelfAttention(8, 2, 0.0, guards=False)
            self.head = nn.Linear(8, 1)

        def forward(self, x, valid):
            return self.head(self.attn(x, valid)).sum()

    m = Wrap()
    with Tracer(m):
        loss = m(torch.randn(2, 5, 8), torch.ones(2, 5, dtype=torch.bool))
    tags = _graph_tags(loss.grad_fn)
    for name in ("SoftmaxBackward0", "BmmBackward0", "DivBackward0", "MaskedFillBackward0"):
        assert tags[name] == {"attn"}, (name, tags[name])
    assert tags["AddmmBackward0"] == {"attn.qkv", "attn.out", "head"}
    assert tags["SumBackward0"] == {""}


def test_first_and_stop_at_first_as_before():
    m = nn.Linear(2, 2)
    with pytest.raises(StopReplay):
        with Tracer(m, stop_at_first=True) as tr:
            torch.log(torch.zeros(2))
            torch.sqrt(torch.tensor([-1.0]))
    assert tr.first.op == "aten.log.default" and tr.first.kind == "inf" and len(tr.origins) == 1
    with Tracer(m) as tr:
        torch.log(torch.zeros(2))
        torch.sqrt(torch.tensor([-1.0]))
    assert tr.first.op == "aten.log.default" and [e.op for e in tr.origins] == ["aten.log.default",
                                                                                "aten.sqrt.default"]
    assert tr.ops_seen >= 4


def test_origins_beyond_the_limit_keep_no_tensors():
    with Tracer(nn.Linear(2, 2), keep=2) as tr:
        for _ in range(3):
            torch.log(torch.zeros(2))
    kept, dropped = tr.origins[1], tr.origins[2]
    assert kept.inputs and kept.note is None
    assert dropped.inputs == [] and dropped.outputs == [] and "beyond the first 2" in dropped.note
    cause, explanation, _ = diagnose(dropped)
    assert cause == "unknown" and "beyond the first 2" in explanation and tr.lineage.dropped == 1


def test_an_origins_evidence_survives_later_in_place_writes():
    x = torch.zeros(3)
    with Tracer(nn.Linear(2, 2)) as tr:
        y = torch.log(x)
        x.add_(5.0)  # the input the origin kept is written later
        y.fill_(1.0)  # and so is its output
    event = tr.origins[0]
    assert float(event.inputs[0][1].sum()) == 0.0 and bool(torch.isinf(event.outputs[0][1]).all())
    assert float(x.sum()) == 15.0 and diagnose(event)[0] == "log_of_nonpositive"


def test_complex_nan_is_a_nan():
    with Tracer(nn.Linear(2, 2)) as tr:
        q = torch.tensor([1 + 0j, 0j]) / torch.tensor([0j, 0j])
    assert bool(torch.isnan(torch.view_as_real(q)).any())
    origin = tr.origin_of(q)
    assert origin.kind == "nan" and origin.op == "aten.div.Tensor" and diagnose(origin)[0] == "div_by_zero"


def test_complex_angle_at_zero_makes_no_harm():
    """angle's backward computes z / |z|^2 (0/0 = NaN) and discards it with where: born, never reaching harm."""
    z = torch.zeros(3, dtype=torch.complex64, requires_grad=True)
    with Tracer(nn.Linear(2, 2)) as tr:
        torch.angle(z * 1).sum().backward()
    assert [(e.backward_node, e.kind) for e in tr.origins] == [("AngleBackward0", "nan")]
    assert bool(torch.isfinite(torch.view_as_real(z.grad)).all()) and tr.origin_of(z.grad) is None


def test_buffer_holding_a_mask_is_a_deliberate_origin_of_its_own():
    class Biased(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("bias", torch.tensor([[0.0, float("-inf")], [float("-inf"), float("-inf")]]))

        def forward(self, s):
            return torch.softmax(s + self.bias, dim=-1)

    m = Biased()
    with Tracer(m) as tr:
        loss = m(torch.zeros(2, 2)).sum()  # row 1 is all -inf: NaN
    origin = tr.origin_of(loss)
    assert origin.op == "aten._softmax.default"
    [buffer] = list(origin.inf_sources)
    assert buffer.label == "buffer `bias`" and buffer.deliberate and buffer.phase == "forward"


def test_built_in_model_source_line_is_the_model_file():
    torch.manual_seed(0)
    attn = SelfAttention(8, 2, 0.0, guards=False)
    valid = torch.ones(2, 5, dtype=torch.bool)
    valid[1] = False
    with Tracer(attn) as tr:
        loss = attn(torch.randn(2, 5, 8), valid).sum()
    origin = tr.origin_of(loss)
    assert origin.op == "aten._softmax.default" and origin.source.startswith("debug_nan/aam/model/attention.py:")
    assert origin.module_class == "debug_nan.aam.model.attention.SelfAttention"
