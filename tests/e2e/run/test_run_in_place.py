"""`debug-nan run` answers in place: the failing micro-batch is replayed from the run's own state and the tape of
the script's code around the model (drivers/run/tape.py), never by running the script again. Each script here is one
shape of real loss code (a gradient penalty, two forwards per micro-batch, a compiled model, files written every
step), with its NaN's origin derived by hand."""

import csv

import pytest
import torch

from tests.support import REPO
from tests.support.run.script_runs import tripped

PENALTY = """import torch
from torch import nn

torch.manual_seed(0)
critic = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
optimizer = torch.optim.SGD(critic.parameters(), lr=0.01)
for step in range(1, 5):
    x = torch.randn(16, 4) * (1e6 if step == 3 else 1.0)  # every tanh saturated: d out / d x is exactly 0
    x.requires_grad_(True)
    out = critic(x)
    (grad_x,) = torch.autograd.grad(out.sum(), x, create_graph=True)
    penalty = grad_x.pow(2).sum().sqrt()  # a gradient penalty: its backward divides by sqrt(0) here
    loss = out.pow(2).mean() + 0.1 * penalty
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
"""

CONTRASTIVE = """import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
encoder = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 8))
optimizer = torch.optim.AdamW(encoder.parameters(), lr=1e-3)
for step in range(1, 5):
    x = torch.randn(8, 6)
    view1, view2 = x + 0.1 * torch.randn_like(x), x + 0.1 * torch.randn_like(x)
    temperature = torch.tensor(0.0 if step == 3 else 0.1)  # a schedule that reaches 0
    z1, z2 = F.normalize(encoder(view1), dim=-1), F.normalize(encoder(view2), dim=-1)
    logits = z1 @ z2.T / temperature
    loss = F.cross_entropy(logits, torch.arange(8))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
"""

FILES = """import csv
import sys

import torch
from tests.support import models

torch.manual_seed(0)
model = models.Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 4
for step, batch in enumerate(models.batches(labels=True, empty_at=(2,))[:steps], start=1):
    loss = models.regression_loss(model, batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    torch.save(model.state_dict(), "checkpoint.pt")
    with open("losses.csv", "a", newline="") as f:
        csv.writer(f).writerow([step, f"{loss.item():.6f}"])
"""

COMPILED = """import torch
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def forward(self, x):
        h = self.proj(x)
        e = torch.exp(h)  # a hand-written softmax: exp overflows float32 past 88.7
        return e / e.sum(-1, keepdim=True)


torch.manual_seed(0)
model = torch.compile(Net())
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 5):
    x = torch.randn(8, 4) * (1e3 if step == 3 else 1.0)
    loss = model(x).pow(2).sum()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""

# a mixture of experts' router keeps its balance loss on itself (`self.aux_loss`), which the loop adds to its loss
MOE = """import torch
from torch import nn


class Router(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(8, 8)
        self.temperature, self.aux_loss = 1.0, None

    def forward(self, h):
        probs = (self.gate(h) / self.temperature).softmax(-1)
        self.aux_loss = -probs.mean(0).log().mean()  # a balance loss kept on the module, as MoE code does
        return h * probs.max(-1, keepdim=True).values


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.router, self.head = nn.Linear(6, 8), Router(), nn.Linear(8, 1)

    def forward(self, x):
        return self.head(self.router(self.embed(x)))


torch.manual_seed(0)
model = Net()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
for step in range(1, 6):
    model.router.temperature = 1e-4 if step == 3 else 1.0  # an annealing schedule that goes too far
    x, y = torch.randn(4, 6), torch.randn(4, 1)
    loss = (model(x) - y).pow(2).mean() + 0.01 * model.router.aux_loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
"""

# a feature loss: a forward hook stores a layer's output in the script's dict, the loss code reads it there
FEATURES = """import torch
from torch import nn

features = {}


def keep(name):
    def hook(module, args, output):
        features[name] = output
    return hook


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 8, bias=False), nn.ReLU(), nn.Linear(8, 1))
model[1].register_forward_hook(keep("relu"))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 5):
    x = torch.randn(6, 4) * (0.0 if step == 3 else 1.0)  # step 3: a batch of padding, every ReLU output 0
    loss = model(x).pow(2).mean() - 0.01 * features["relu"].mean().log()  # a feature loss: log(0) there
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
"""


def test_a_gradient_penalty_is_replayed_through_its_autograd_grad(tmp_path, run_here):
    """torch.autograd.grad inside the loss code, with respect to the model's own input (a leaf that requires
    grad): recorded and called again. At step 3 every tanh is saturated, the input gradient is exactly 0, and
    the penalty's sqrt has an infinite derivative there."""
    first, stdout, _ = tripped(run_here, tmp_path, PENALTY, "penalty.py")
    assert (first["step"], first["micro_step"], first["phase"], first["cause"]) == (
        3, 1, "backward", "grad_at_singularity")
    assert first["backward_node"] == "SqrtBackward0" and first["source"] == "penalty.py:12"
    assert stdout.count("\n") == 2 and stdout.startswith("step 1 loss ")


def test_two_forwards_per_micro_batch_are_replayed_with_their_outside_tensors(tmp_path, run_here):
    """A contrastive pair (the model called twice) and a temperature tensor made outside the model: the division
    by the 0 temperature is the origin, in the loss code, at its own line."""
    first, _, _ = tripped(run_here, tmp_path, CONTRASTIVE, "contrastive.py")
    assert (first["step"], first["phase"], first["op"], first["cause"], first["source"]) == (
        3, "loss", "aten.div.Tensor", "div_by_zero", "contrastive.py:13")


def test_files_the_script_writes_are_left_as_the_plain_run_left_them(tmp_path, run_here):
    """No second writer: the checkpoint and the CSV after the stop are exactly what the plain run writes up to the
    failing step (its step 3 never wrote them)."""
    (tmp_path / "files.py").write_text(FILES)
    done, _, _ = run_here("python", "files.py")
    assert done.code == 1 and (done.first["step"], done.first["op"]) == (3, "aten._softmax.default"), done.output
    with open(tmp_path / "losses.csv") as f:
        watched_rows = list(csv.reader(f))
    watched_state = torch.load(tmp_path / "checkpoint.pt")
    plain = tmp_path / "plain"
    plain.mkdir()
    import subprocess
    import sys
    env = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}
    subprocess.run([sys.executable, str(tmp_path / "files.py"), "2"], cwd=plain, env=env, check=True)
    with open(plain / "losses.csv") as f:
        assert watched_rows == list(csv.reader(f)) and len(watched_rows) == 2
    plain_state = torch.load(plain / "checkpoint.pt")
    assert watched_state.keys() == plain_state.keys()
    assert all(torch.equal(watched_state[k], plain_state[k]) for k in plain_state)


def test_a_compiled_model_is_replayed_eagerly_and_its_op_named(tmp_path, run_here):
    """torch.compile's fused kernel makes the NaN in the run; the replay runs the model eagerly under the tracer
    and names the exp that overflowed."""
    pytest.importorskip("torch._inductor")
    first, _, stderr = tripped(run_here, tmp_path, COMPILED, "compiled.py")
    assert (first["step"], first["phase"], first["module"], first["op"], first["cause"]) == (
        3, "forward", "", "aten.exp.default", "overflow")
    assert first["source"] == "compiled.py:12"


def test_an_auxiliary_loss_a_module_keeps_on_itself_is_replayed(tmp_path, run_here):
    """The loop reads `model.router.aux_loss`, a tensor the router's forward left on the module (made outside the
    tape, with a graph): the replay reads the attribute again after the replayed forward. At step 3 the annealed
    temperature makes the routing one-hot, an expert gets no probability at all and the balance loss's log is
    -inf."""
    first, stdout, _ = tripped(run_here, tmp_path, MOE, "moe.py")
    assert (first["step"], first["phase"], first["module"], first["op"], first["cause"], first["source"]) == (
        3, "forward", "router", "aten.log.default", "log_of_nonpositive", "moe.py:13")
    assert stdout.count("\n") == 2


def test_a_hooks_stash_the_loss_code_reads_is_replayed(tmp_path, run_here):
    """The loss reads a layer's output a forward hook stored in the script's dict: the replayed forward runs the
    hook again and the loss code's log is named at its line."""
    first, stdout, _ = tripped(run_here, tmp_path, FEATURES, "features.py")
    assert (first["step"], first["phase"], first["op"], first["cause"], first["source"]) == (
        3, "loss", "aten.log.default", "log_of_nonpositive", "features.py:19")
    assert stdout.count("\n") == 2
