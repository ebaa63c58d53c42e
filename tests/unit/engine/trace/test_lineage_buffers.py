"""A buffer an op writes non-finite is no ancestor of the op's finite results: BatchNorm in training mode at huge
activations writes running_var Inf (~1e59) while its normalised output stays finite; the Linear after it makes the
NaN that reaches the loss, and the buffer is an unharmed writer (a note), with the variance's own size as evidence."""

import torch
from torch import nn

from debug_nan.engine.explain.diagnose import diagnose
from debug_nan.engine.trace.tracer import Tracer


def test_the_linear_is_the_origin_and_the_running_variance_an_unharmed_write():
    torch.manual_seed(0)
    model = nn.Sequential(nn.BatchNorm1d(3), nn.Linear(3, 2))
    with torch.no_grad():
        model[0].bias.fill_(1e28)
        model[1].weight.fill_(1e30)
    x = torch.randn(8, 3) * 1e30
    with Tracer(model) as tracer:
        loss = model(x).sum()
    batch_norm = tracer.origins[0]
    assert batch_norm.op == "aten.native_batch_norm.default"
    assert [n for n, _ in batch_norm.outputs] == ["out[0]", "out[1]", "out[2]", "running_mean", "running_var"]
    origin = tracer.origin_of(loss)
    assert origin.op == "aten.addmm.default" and tracer.consequence is None
    (name, writer), = tracer.lineage.unharmed_writers(list(model.named_buffers()))
    assert (name, writer) == ("0.running_var", batch_norm)
    _, evidence, _ = diagnose(batch_norm)
    largest = float(evidence.split("largest |result| of `running_var` is ")[1].rstrip("."))
    assert largest > 1e50  # (the float64 variance itself, not the finite normalised output's ~1e28)
