"""`debug-nan run` names the first birth, where the harm's value came from: an Inf the forward made finite again
(a norm's x.pow(2) on a huge residual stream) and the ops of a custom autograd Function's own backward."""

from tests.support.run.script_runs import tripped

# a pre-norm residual stack with an RMSNorm written by hand; a learning rate far too high blows the weights up in
# one update, so the second step's residual stream is ~7e19 and the next norm's x.pow(2) overflows float32
PRE_NORM = """import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(width))

    def forward(self, x):
        inv = torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)
        return x * inv * self.gain


class Gated(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm, self.up, self.down = RMSNorm(width), nn.Linear(width, 2 * width), nn.Linear(width, width)

    def forward(self, x):
        value, gate = self.up(self.norm(x)).chunk(2, dim=-1)
        return x + self.down(value * torch.sigmoid(gate))


class Stack(nn.Module):
    def __init__(self, width=16, depth=4):
        super().__init__()
        self.layers = nn.ModuleList(Gated(width) for _ in range(depth))
        self.norm, self.head = RMSNorm(width), nn.Linear(width, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


torch.manual_seed(0)
model = Stack()
optimizer = torch.optim.SGD(model.parameters(), lr=5e7)
for step in range(1, 6):
    x = torch.randn(8, 16)
    loss = (model(x) - 1.0).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4g}")
"""


def test_the_norms_forward_overflow_is_named_not_the_backward_birth_it_led_to(tmp_path, run_here):
    """Step 2's loss is finite (rsqrt(inf) = 0 makes the norm's output 0) and its gradients are NaN. The NaN is
    born in the norm's backward, from finite values that descend from the forward x.pow(2)'s Inf: the pow, first
    in execution order, is the finding, and the backward birth is named as its consequence."""
    first, stdout, _ = tripped(run_here, tmp_path, PRE_NORM, "prenorm.py")
    assert (first["step"], first["micro_step"], first["phase"], first["op"], first["kind"], first["cause"]) == (
        2, 1, "forward", "aten.pow.Tensor_Scalar", "inf", "overflow")
    assert (first["module"], first["module_type"], first["source"]) == ("layers.1.norm", "RMSNorm", "prenorm.py:11")
    assert "aten.sum.dim_IntList (backward, in MulBackward0)" in first["explanation"]
    assert "consequence of this one" in first["explanation"]
    assert stdout.count("\n") == 1 and stdout.startswith("step 1 loss ")
