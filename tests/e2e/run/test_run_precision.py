"""`debug-nan run` on scripts in mixed precision (CPU autocast, fp16 and bf16, with and without a GradScaler): the
replay runs each recorded call in the autocast state it ran in, so an fp16 overflow comes back as it happened; the
GradScaler's skips are told from a real NaN by replaying the backward at scale 1."""

import pytest

from tests.support.precision import CPU_FP16, NO_CPU_FP16
from tests.support.run.script_runs import same_as_alone, write

pytestmark = pytest.mark.skipif(not CPU_FP16, reason=NO_CPU_FP16)

# Attention without the 1/sqrt(d) scale: on the batch in raw units (`python attn.py 3`: step 3) q @ k^T passes
# float16's 65504 under the script's autocast, and the softmax of those rows makes NaN. The loss code has a
# custom Function under torch.amp.custom_fwd / custom_bwd, a nested autocast(enabled=False) region and a helper
# decorated with torch.autocast.
ATTENTION = """import sys

import torch
from torch import nn

torch.manual_seed(0)


class Gate(torch.autograd.Function):
    @staticmethod
    @torch.amp.custom_fwd(device_type="cpu", cast_inputs=torch.float32)
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * torch.sigmoid(x)

    @staticmethod
    @torch.amp.custom_bwd(device_type="cpu")
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        s = torch.sigmoid(x)
        return grad * (s + x * s * (1 - s))


class Attention(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        scores = q @ k.transpose(-2, -1)
        return torch.softmax(scores, dim=-1) @ v


class Model(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.attn, self.head = Attention(d), nn.Linear(d, 1)

    def forward(self, x):
        return self.head(self.attn(x)).squeeze(-1)


@torch.autocast("cpu", dtype=torch.float16)
def centred(pred):
    return pred - pred.mean()


model = Model()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
raw = int(sys.argv[1]) if len(sys.argv) > 1 else 0
for step in range(1, 6):
    x, y = torch.randn(2, 8, 16), torch.randn(2, 8)
    if step == raw:
        x = x * 300.0  # one batch in raw units
    with torch.autocast("cpu", dtype=torch.float16):
        pred = model(x)
        gated = Gate.apply(centred(pred))
        with torch.autocast("cpu", enabled=False):
            loss = (gated.float() - y).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f} {pred.dtype} {gated.dtype}")
"""


def test_an_fp16_attention_overflow_is_named_at_its_matmul(tmp_path, run_here):
    write(tmp_path, ATTENTION, "attn.py")
    done, stdout, _ = run_here("python", "attn.py", "3")
    assert done.code == 1, done.output
    first = done.first
    assert (first["step"], first["micro_step"], first["phase"], first["module"], first["op"], first["cause"],
            first["source"]) == (3, 1, "forward", "attn", "aten.bmm.default", "overflow", "attn.py:31")
    assert "Low precision: float16 result beyond 65504" in first["explanation"]
    assert "headroom in float16" in first["explanation"] and "diverged" not in first["explanation"]
    assert first["suggestions"][0].startswith("Scale what grows before it leaves float16's range")
    assert 'torch.autocast("cpu", enabled=False)' in first["suggestions"][1] and "attn.py:31" in first["suggestions"][1]
    assert stdout.count("\n") == 2  # steps 1 and 2 printed: the script was stopped in step 3


def test_a_healthy_autocast_run_is_the_plain_run_byte_for_byte(tmp_path, run_here):
    done, stdout, stderr = same_as_alone(run_here, write(tmp_path, ATTENTION, "attn.py"))
    assert done.report["status"] == "clean" and done.report["steps_run"] == 5
    assert "torch.float16 torch.float32" in stdout  # the model ran in float16, the custom Function in float32
    assert "skipped" not in stderr


# fp16 autocast and a GradScaler. The first steps overflow float16 at the default scale (65536) by design and are
# skipped; `python rms.py 5` zeroes the last rows of every batch from step 5 (padding), where the hand-written RMS
# norm takes sqrt(0): its forward stays finite (0 / eps), its backward is 0 * inf = NaN at any scale.
RMS = """import sys

import torch
from torch import nn

torch.manual_seed(0)


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        rms = torch.sqrt(x.float().pow(2).mean(-1, keepdim=True))
        return (x / (rms + 1e-6)).to(x.dtype) * self.weight


model = nn.Sequential(nn.Linear(8, 16, bias=False), RMSNorm(16), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cpu")
padded_from = int(sys.argv[1]) if len(sys.argv) > 1 else 0
for step in range(1, 9):
    x, y = torch.randn(4, 6, 8), torch.randn(4, 6)
    if padded_from and step >= padded_from:
        x[:, -2:] = 0
    with torch.autocast("cpu", dtype=torch.float16):
        pred = model(x).squeeze(-1)
    loss = (pred.float() - y).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f} scale {scaler.get_scale():g}")
"""


def test_steps_the_grad_scaler_skips_by_design_are_one_line_and_the_run_is_clean(tmp_path, run_here):
    done, stdout, stderr = same_as_alone(run_here, write(tmp_path, RMS, "rms.py"))
    assert done.report["status"] == "clean" and done.report["steps_run"] == 8
    assert [h["scaler_skipped"] for h in done.report["history"]][:3] == [True, True, False]
    assert stderr.count("skipped by the GradScaler:") == 1
    assert "steps 1-2 skipped by the GradScaler: scale 65536 -> 16384" in stderr
    assert "2 of 8 step(s) skipped by the GradScaler (steps 1..2)" in stderr


def test_a_real_nan_under_the_grad_scaler_is_found_at_its_first_step(tmp_path, run_here):
    write(tmp_path, RMS, "rms.py")
    done, stdout, stderr = run_here("python", "rms.py", "5")
    assert done.code == 1, done.output
    first = done.first
    assert (first["step"], first["phase"], first["module"], first["backward_node"], first["cause"],
            first["source"]) == (5, "backward", "1", "SqrtBackward0", "grad_at_singularity", "rms.py:15")
    assert stdout.count("\n") == 4  # the plain run prints 8 lines, its scale halving at every step from 5
    assert "steps 1-2 skipped by the GradScaler" in stderr
    assert stderr.index("skipped by the GradScaler:") < stderr.index("TRIP at step 5")


# bf16 autocast with a GradScaler that starts at 2**127 and backs off by 0.9 only: the scaled loss stays past
# float32's range for ever more steps, each skipped (finite at scale 1), and the model never updates.
LONG_SKIPS = """import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127, backoff_factor=0.9)
for step in range(1, 41):
    x, y = torch.randn(8, 4), 1000 * torch.randn(8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        pred = model(x).squeeze(-1).float()
    loss = (pred - y).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
"""


def test_a_grad_scaler_that_skips_every_step_for_long_is_a_finding(tmp_path, run_here):
    write(tmp_path, LONG_SKIPS, "skips.py")
    done, _, stderr = run_here("python", "skips.py")
    assert done.code == 1, done.output
    first = done.first
    assert (first["step"], first["phase"], first["cause"], first["detected_by"]) == (32, "backward", "overflow",
                                                                                   "gradient history")
    assert "The GradScaler skipped 32 steps in a row (steps 1-32)" in first["explanation"]
    assert "steps 1-32 skipped by the GradScaler: scale 1.7e38 -> 5.8e36" in stderr
