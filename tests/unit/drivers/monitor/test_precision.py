"""The Monitor in mixed precision: its replay calls loss_fn under the autocast state the model's forward ran under
in the user's step() block, so an fp16 overflow comes back as it happened."""

import pytest
import torch
from torch import nn

import debug_nan
from tests.support.precision import CPU_FP16, NO_CPU_FP16


class Scores(nn.Module):
    """Attention scores without the 1/sqrt(d) scale, softmaxed."""

    def __init__(self, d=16):
        super().__init__()
        self.q, self.k = nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        return torch.softmax(self.q(x) @ self.k(x).transpose(-2, -1), dim=-1)


def loss_fn(model, x):
    return model(x).float().pow(2).mean()


@pytest.mark.skipif(not CPU_FP16, reason=NO_CPU_FP16)
def test_an_fp16_overflow_in_the_users_autocast_is_replayed_in_fp16():
    torch.manual_seed(0)
    model = Scores()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    batches = [torch.randn(2, 8, 16), torch.randn(2, 8, 16) * 300.0]  # the second in raw units
    with pytest.raises(debug_nan.NonFiniteError) as info, debug_nan.Monitor(model, loss_fn, optimizer) as monitor:
        for x in batches:
            with monitor.step(x) as step:
                with torch.autocast("cpu", dtype=torch.float16):
                    loss = loss_fn(model, x)
                step.watch_loss(loss)
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
    f = info.value.finding
    assert (f.step, f.phase, f.op, f.cause, f.detected_by) == (2, "forward", "aten.bmm.default", "overflow", "replay")
    assert "Low precision: float16 result beyond 65504" in f.explanation
