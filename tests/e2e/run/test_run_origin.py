"""`debug-nan run` names the first birth, where the harm's value came from: an Inf the forward made finite again
(a norm's x.pow(2) on a huge residual stream) and the ops of a custom autograd Function's own backward."""

from tests.e2e.run.test_run_bundles import replay_elsewhere
from tests.support.run.script_runs import same_as_alone, tripped, write

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


# a custom autograd Function in the loss code, its backward written by hand: it divides by the row's norm, which is
# exactly 0 for the padding row step 3 zeroes
CUSTOM = """import torch
from torch import nn


class UnitRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        norm = x.norm(dim=-1, keepdim=True)
        ctx.save_for_backward(x, norm)
        return x / norm.clamp_min(1e-12)

    @staticmethod
    def backward(ctx, grad):
        x, norm = ctx.saved_tensors
        unit = x / norm
        return (grad - unit * (grad * unit).sum(-1, keepdim=True)) / norm


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 5):
    x, target = torch.randn(6, 4), torch.randn(6, 3)
    keep = torch.ones(6)
    if step == 3:
        keep[4] = 0.0  # a padding row
    loss = (UnitRows.apply(model(x) * keep[:, None]) - target).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
"""

# activations stored in float16 by saved-tensor hooks until the backward: what the in-place replay cannot follow
PACKED = """import torch
from torch import nn


def pack(t):
    return t.half()


def unpack(t):
    return t.float()


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(1, 5):
    x = torch.randn(8, 4) * (1e5 if step == 3 else 1.0)  # step 3: features left unnormalised
    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
"""


def test_a_custom_functions_backward_is_replayed_and_its_op_named_at_its_line(tmp_path, run_here):
    """The Function is one entry of the tape, called again by the replay, so its own backward runs under the
    tracer: the division by the zero norm is named in the backward, at the backward's line, outside the model."""
    first, stdout, _ = tripped(run_here, tmp_path, CUSTOM, "custom.py")
    assert (first["step"], first["micro_step"], first["phase"], first["op"], first["cause"]) == (
        3, 1, "backward", "aten.div.Tensor", "div_by_zero")
    assert (first["source"], first["backward_node"], first["module"]) == ("custom.py:15", "UnitRowsBackward", "")
    assert first["detected_by"] == "replay" and stdout.count("\n") == 2
    code, output, report = replay_elsewhere(tmp_path, first["bundle"], "custom.py")  # the class travels by value
    assert code == 1, output
    replayed = report["first_nonfinite"]
    assert (replayed["op"], replayed["phase"], replayed["backward_node"]) == (
        "aten.div.Tensor", "backward", "UnitRowsBackward")
    assert replayed["source"].endswith("custom.py:15")


def test_a_replay_that_stays_finite_says_so_and_gives_the_exact_trace_at_command(tmp_path, run_here):
    """The replay runs the model outside the script's saved-tensor hooks, so its float16 overflow is not there:
    the finding says the replay did not follow the run, and its first suggestion is the command that traces the
    micro-batch as it runs, which then names the pack hook's cast."""
    first, _, _ = tripped(run_here, tmp_path, PACKED, "packed.py")
    assert (first["step"], first["micro_step"], first["cause"], first["detected_by"]) == (3, 1, "unknown", "watch")
    assert "stayed finite where the run did not" in first["explanation"]
    assert "non-deterministic" not in first["explanation"]
    assert first["suggestions"][0].startswith(
        "Run the command again as `debug-nan run --trace-at 3:1 -- python packed.py`")

    done, _, _ = run_here("python", "packed.py", options=("--trace-at", "3:1"))
    again = done.first
    assert (again["step"], again["phase"], again["op"], again["cause"], again["source"], again["module"]) == (
        3, "forward", "aten._to_copy.default", "overflow", "packed.py:6", "0")


# a compiled model whose forward applies a custom Function, and the same Function in the loss code
COMPILED = """import torch
from torch import nn


class Clip(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clamp(-1.0, 1.0)

    @staticmethod
    def backward(ctx, grad):
        return grad  # a straight-through estimator


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        return Clip.apply(self.proj(x))


torch.manual_seed(0)
model = torch.compile(Net(), backend="aot_eager")
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 4):
    loss = Clip.apply(model(torch.randn(8, 4))).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
"""


def test_a_compiled_forward_traces_the_functions_own_apply(tmp_path, run_here):
    """The recording of custom Functions is off inside the model's forward, where torch.compile traces `apply`:
    the run is clean and prints what the plain run prints."""
    done, stdout, _ = same_as_alone(run_here, write(tmp_path, COMPILED, "compiled.py"))
    assert done.report["status"] == "clean" and done.report["steps_run"] == 3 and stdout.count("\n") == 3
