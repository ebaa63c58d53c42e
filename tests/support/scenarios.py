"""Task plug-ins used by the scenario tests, one numerical failure each (and one healthy model).

Run any of them from the CLI, e.g.
    debug-nan --task tests/support/scenarios.py:masked_softmax --max-steps 3 --report r.json
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn

ROOT = str(Path(__file__).resolve().parents[2])  # the repository: a --task file is loaded by path, maybe elsewhere
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from tests.support import models  # noqa: E402

D = models.D


def _mse(model, batch):
    return F.mse_loss(model(batch["x"]), batch["y"])


def _masked(n=4, **at):
    """The masked-attention batches of these scenarios: 4 unless said, with sample ids (models.batches)."""
    return models.batches(n=n, sample_ids=True, **at)


def masked_softmax():
    torch.manual_seed(0)
    return SimpleNamespace(model=models.Net(), batches=_masked(empty_at=(0,)), loss=models.regression_loss)


def healthy_masks():
    """-inf masks everywhere, but every row keeps a valid key: must come out clean."""
    torch.manual_seed(0)
    return SimpleNamespace(model=models.Net(), batches=_masked(), loss=models.regression_loss)


def accumulation():
    """8 batches; only the 7th (step 2, micro-batch 3 under accumulation 4) has an all-masked sample."""
    torch.manual_seed(0)
    return SimpleNamespace(model=models.Net(), batches=_masked(n=8, empty_at=(6,)), loss=models.regression_loss)


def raises_on_nan():
    """AAM-style loss that refuses NaN predictions with a ValueError."""
    torch.manual_seed(0)

    def loss(model, batch):
        pred = model(batch["x"], batch["valid"])
        if torch.isnan(pred).any():
            raise ValueError(f"NaN values found in predictions with shape {tuple(pred.shape)}")
        return models.regression_loss(model, batch)

    return SimpleNamespace(model=models.Net(), batches=_masked(empty_at=(1,)), loss=loss)


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(D, 16), nn.ReLU(), nn.Linear(16, 3))

    def forward(self, x):
        return self.net(x)


def log_zero_loss():
    """Hand-written NLL: -log(p[target]) where a probability underflows to exactly 0."""
    torch.manual_seed(0)
    model = Classifier()
    with torch.no_grad():
        model.net[2].weight.mul_(200.0)  # very confident logits: exp() of the losing classes underflows to 0
    g = torch.Generator().manual_seed(1)
    batches = [{"x": torch.randn(16, D, generator=g) * 10, "y": torch.randint(0, 3, (16,), generator=g)}
               for _ in range(2)]

    def loss(model, batch):
        probs = torch.softmax(model(batch["x"]), dim=-1)
        picked = probs.gather(1, batch["y"][:, None]).squeeze(1)
        return -torch.log(picked).mean()

    return SimpleNamespace(model=model, batches=batches, loss=loss)


class Normalizer(nn.Module):
    """Turns scores into weights by dividing by their sum: an all-zero row is 0 / 0."""

    def __init__(self):
        super().__init__()
        self.score = nn.Linear(D, 1)

    def forward(self, x, keep):
        w = F.softplus(self.score(x)).squeeze(-1) * keep  # [B, L]
        w = w / w.sum(dim=1, keepdim=True)
        return (w.unsqueeze(-1) * x).sum(1)


class Pool(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = Normalizer()
        self.head = nn.Linear(D, 1)

    def forward(self, x, keep):
        return self.head(self.norm(x, keep)).squeeze(-1)


def div_by_zero_sum():
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(2)
    keep = torch.ones(4, 5)
    keep[3] = 0.0
    batches = [{"x": torch.randn(4, 5, D, generator=g), "keep": keep, "y": torch.randn(4, generator=g)}]
    return SimpleNamespace(model=Pool(), batches=batches,
                           loss=lambda m, b: F.mse_loss(m(b["x"], b["keep"]), b["y"]))


class Embedder(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(D, D)

    def forward(self, x):
        z = self.proj(x)
        d2 = ((z[:, None, :] - z[None, :, :]) ** 2).sum(-1)
        return torch.sqrt(d2)  # [B, B]; zero on the diagonal


def sqrt_distance():
    """Pairwise distances with sqrt at 0 on the diagonal: forward finite, backward NaN."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(3)
    batches = [{"x": torch.randn(5, D, generator=g), "d": torch.rand(5, 5, generator=g)} for _ in range(2)]

    def loss(model, batch):
        pred = model(batch["x"])
        off = 1.0 - torch.eye(pred.shape[0])
        return (((pred - batch["d"]) ** 2) * off).sum() / off.sum()

    return SimpleNamespace(model=Embedder(), batches=batches, loss=loss)


class Wide(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(D, 64)
        self.proj = nn.Linear(64, 64)
        self.out = nn.Linear(64, 1)

    def forward(self, x):
        return self.out(torch.relu(self.proj(torch.relu(self.inp(x))))).squeeze(-1)


def fp16_overflow():
    """Activations of ~100 times weights of 30 summed over 64 inputs: beyond float16's 65504. Run with --precision
    fp16."""
    torch.manual_seed(0)
    model = Wide()
    with torch.no_grad():
        model.proj.weight.fill_(30.0)
    g = torch.Generator().manual_seed(4)
    batches = [{"x": torch.rand(8, D, generator=g) * 400, "y": torch.randn(8, generator=g)} for _ in range(2)]
    return SimpleNamespace(model=model, batches=batches, loss=_mse)


def nan_targets():
    """The second batch's targets hold NaN (a missing value that preprocessing let through)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(5)
    batches = [{"x": torch.randn(6, D, generator=g), "y": torch.randn(6, generator=g),
                "sample_ids": [f"b{i}s{j}" for j in range(6)]} for i in range(3)]
    batches[1]["y"][4] = float("nan")
    model = nn.Sequential(nn.Linear(D, 16), nn.Tanh(), nn.Linear(16, 1), nn.Flatten(0))
    return SimpleNamespace(model=model, batches=batches, loss=_mse)


class Deep(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(D, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 32),
                                    nn.ReLU(), nn.Linear(32, 1))

    def forward(self, x):
        return self.layers(x).squeeze(-1)


def high_lr():
    """A healthy MLP regression; run it with a learning rate far too high (e.g. --lr 3) and it explodes."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(6)
    batches = [{"x": torch.randn(32, D, generator=g), "y": torch.randn(32, generator=g)} for _ in range(4)]
    return SimpleNamespace(model=Deep(), batches=batches, loss=_mse)


def adam_eps_zero():
    """Adam with eps=0 and a parameter whose gradient is exactly 0: the update is 0/0 in the optimizer."""
    torch.manual_seed(0)

    g = torch.Generator().manual_seed(7)
    batches = [{"x": torch.randn(8, D, generator=g), "y": torch.randn(8, generator=g)} for _ in range(2)]
    return SimpleNamespace(model=models.Gated(), batches=batches, loss=_mse,
                           optimizer=lambda params: torch.optim.Adam(params, lr=1e-2, eps=0.0))


def with_settings(settings):
    """A factory may take the run's settings: the batch size comes from --batch-size."""
    torch.manual_seed(settings.seed)
    g = torch.Generator().manual_seed(8)
    batches = [{"x": torch.randn(settings.batch_size, D, generator=g), "y": torch.randn(settings.batch_size,
                                                                                       generator=g)}]
    model = nn.Sequential(nn.Linear(D, 4), nn.Tanh(), nn.Linear(4, 1), nn.Flatten(0))
    return {"model": model, "batches": batches, "loss": lambda m, b: {"loss": _mse(m, b), "mse": _mse(m, b)}}


def hidden_by_where():
    """log() of values that can be 0, 'hidden' by torch.where: the forward is finite, the -inf leaks into the
    gradient as 0 * inf = NaN."""
    torch.manual_seed(0)

    class SafeLog(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(D, D)

        def forward(self, x, keep):
            h = self.lin(x) * keep  # exact zeros where keep is 0
            return torch.where(keep > 0, torch.log(h.abs()), torch.zeros_like(h)).sum(-1)

    g = torch.Generator().manual_seed(9)
    keep = torch.ones(8, D)
    keep[:, :2] = 0.0
    batches = [{"x": torch.randn(8, D, generator=g), "keep": keep, "y": torch.randn(8, generator=g)}
               for _ in range(2)]
    return SimpleNamespace(model=SafeLog(), batches=batches,
                           loss=lambda m, b: F.mse_loss(m(b["x"], b["keep"]), b["y"]))


def not_a_task():
    """Returns the wrong shape of object: the CLI must say what is missing (exit 2)."""
    return SimpleNamespace(model="a string", batches=5, loss=None)


def out_of_memory():
    """A loss that fails the way CUDA does when a batch is too large."""

    def loss(model, batch):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
                                     "of 79.1 GiB of which 1.2 GiB is free.")

    return SimpleNamespace(model=nn.Linear(D, 1), batches=[{"x": torch.randn(2, D)}], loss=loss)


def interrupted_at_step_2():
    """Ctrl-C during the second step."""
    calls = []
    model = nn.Linear(D, 1)

    def loss(model, batch):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return model(batch["x"]).pow(2).mean()

    return SimpleNamespace(model=model, batches=[{"x": torch.randn(2, D)}], loss=loss)


def ddp_poisoned_rank1():
    """For a 2-rank run: micro-batches are dealt out alternately, so batch 3 (with an all-masked sample) is
    rank 1's second micro-batch; rank 0 never sees it."""
    torch.manual_seed(0)
    return SimpleNamespace(model=models.Net(), batches=_masked(empty_at=(3,)), loss=models.regression_loss)


def ddp_raises_on_rank1():
    """2 ranks: rank 1's second micro-batch makes NaN and its loss raises (AAM style); rank 0 is healthy and
    must not hang in the gradient all-reduce."""
    base = raises_on_nan()
    base.batches = _masked(empty_at=(3,))
    return base


def bad_optimizer():
    """optimizer(params) returns something that is not an optimizer."""
    return SimpleNamespace(model=nn.Linear(D, 1), batches=[{"x": torch.randn(2, D)}],
                           loss=lambda m, b: m(b["x"]).sum(), optimizer=lambda params: "sgd")


def fp16_scaler_overflow():
    """Healthy in fp16 (gradients ~1), but the initial loss scale 65536 pushes the scaled weight gradients
    past 65504: the scaler skips those steps and lowers the scale, which is expected and no finding."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 64), nn.Linear(64, 1))
    with torch.no_grad():
        model[1].weight.fill_(0.3)
    g = torch.Generator().manual_seed(10)
    batches = [{"x": torch.randn(8, D, generator=g)} for _ in range(2)]
    return SimpleNamespace(model=model, batches=batches, loss=lambda m, b: m(b["x"]).sum())


def ddp_one_batch():
    """A single micro-batch for 2 ranks: dealt out across passes, both ranks still train."""
    torch.manual_seed(0)
    return SimpleNamespace(model=models.Net(), batches=_masked(n=1), loss=models.regression_loss)


def ddp_raises_before_forward():
    """Rank 1's second micro-batch makes its loss raise before the model runs: the other rank must not hang."""
    torch.manual_seed(0)
    batches = _masked()
    batches[3]["bad"] = True

    def loss(model, batch):
        if batch.get("bad"):
            raise KeyError("column 'y2' missing from this batch")
        return models.regression_loss(model, batch)

    return SimpleNamespace(model=models.Net(), batches=batches, loss=loss)


def one_shot_generator():
    """`batches` as a one-shot generator: it runs dry on the second pass (a clear exit 2, on every rank)."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(11)
    batches = ({"x": torch.randn(4, D, generator=g)} for _ in range(3))
    return SimpleNamespace(model=nn.Linear(D, 1), batches=batches, loss=lambda m, b: m(b["x"]).pow(2).mean())


def ddp_optimizer_overflow():
    """2 ranks, SGD at lr 1e25: rank 1's inputs make its gradient 1e18, the averaged update overflows the weight.
    Only the averaged gradient reproduces it: rank 0's own gradient alone stays finite."""
    torch.manual_seed(0)
    batches = [{"x": torch.ones(4, D)}, {"x": torch.full((4, D), 1e18)}]
    return SimpleNamespace(model=nn.Linear(D, 1, bias=False), batches=batches, loss=lambda m, b: m(b["x"]).sum(),
                           optimizer=lambda params: torch.optim.SGD(params, lr=1e25))


class FailingBackward(torch.autograd.Function):
    """Identity forward; its backward raises (a custom kernel failing half-way through the backward)."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("custom backward kernel failed")


def ddp_backward_raises():
    """2 ranks: rank 1's second micro-batch raises in the middle of its backward, after the gradients of the
    layers behind it were sent. Rank 0 must not hang in a gradient all-reduce."""
    torch.manual_seed(0)
    g = torch.Generator().manual_seed(12)
    batches = [{"x": torch.randn(4, D, generator=g)} for _ in range(4)]
    batches[3]["fail"] = True
    return SimpleNamespace(model=_TwoHalves(), batches=batches,
                           loss=lambda m, b: m(b["x"], fail=b.get("fail", False)).pow(2).mean())


class _TwoHalves(nn.Module):
    def __init__(self):
        super().__init__()
        self.front = nn.Sequential(nn.Linear(D, 16), nn.Tanh())
        self.back = nn.Sequential(nn.Linear(16, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x, fail: bool = False):
        h = self.front(x)
        return self.back(FailingBackward.apply(h) if fail else h)


def ddp_optimizer_fails_on_rank1():
    """2 ranks: the task's optimizer factory fails on rank 1 only (a node missing a package, say), after the task
    was built: rank 0 must not wait in DDP's first collective."""
    import os

    def optimizer(params):
        if os.environ.get("RANK") == "1":
            raise ImportError("No module named 'apex' (this node's environment)")
        return torch.optim.SGD(params, lr=0.1)

    return SimpleNamespace(model=nn.Linear(D, 1), batches=[{"x": torch.randn(4, D)} for _ in range(2)],
                           loss=lambda m, b: m(b["x"]).pow(2).mean(), optimizer=optimizer)
