"""NaN/Inf bugs reported in public projects, rebuilt as `--task` plug-ins (code nobody on this team wrote).

Each factory names the thread it rebuilds and the origin expected from first principles; the expectations are
asserted in tests/e2e/cli/test_public_bugs.py. Run one by hand, e.g.
    debug-nan --task tests/support/public_bugs.py:where_exp_overflow --max-steps 2 --device cpu
"""

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import Categorical

D = 8


def _batches(n: int, make, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    return [make(i, g) for i in range(n)]


# -- pytorch/pytorch#68425: torch.where(a <= 0, exp(a), 1 + a) ------------------------------------------------
class SafeExp(nn.Module):
    """The thread's activation: exp on the negative side, linear on the positive side. exp(a) is still computed
    for the large positive a, overflows float32 to Inf, and torch.where hides it in forward only."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.full((D,), 60.0))

    def forward(self, x):
        a = self.scale * x
        return torch.where(a <= 0, torch.exp(a), 1 + a)


def where_exp_overflow():
    """Expected: forward, module `act` (SafeExp), aten.exp.default, inf, overflow (exp of 60 * x > 88.7 exceeds
    float32; float64 holds it). The loss stays finite; the gradient is NaN (0 * inf in ExpBackward)."""
    torch.manual_seed(0)
    model = nn.ModuleDict({"act": SafeExp(), "head": nn.Linear(D, 1)})

    def loss(m, b):
        return F.mse_loss(m["head"](m["act"](b["x"])).squeeze(-1), b["y"])

    return SimpleNamespace(model=model, loss=loss, batches=_batches(
        2, lambda i, g: {"x": torch.randn(16, D, generator=g) * 2, "y": torch.randn(16, generator=g)}))


# -- pytorch/pytorch#187297: torch.where(x > 0, sqrt(x), x) -----------------------------------------------------
class SqrtWhere(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, x):
        h = self.lin(x)
        return torch.where(h > 0, torch.sqrt(h), h)  # sqrt of the negative h is NaN, selected away


def where_sqrt_inactive():
    """Expected: forward, module `0` (SqrtWhere), aten.sqrt.default, nan, invalid_domain; only gradients show it."""
    torch.manual_seed(0)
    model = nn.Sequential(SqrtWhere(), nn.Linear(D, 1), nn.Flatten(0))
    return SimpleNamespace(model=model, loss=lambda m, b: F.mse_loss(m(b["x"]), b["y"]), batches=_batches(
        2, lambda i, g: {"x": torch.randn(16, D, generator=g), "y": torch.randn(16, generator=g)}))


# -- pytorch/pytorch#70348 and #116349: cross_entropy where every label is ignore_index -----------------------
def cross_entropy_all_ignored():
    """A token tagger; the second micro-batch is all padding (labels -100). mean over zero counted targets = 0/0.
    Expected: step 2, loss, aten.nll_loss_forward.default, nan, div_by_zero (the count of targets is 0)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(20, D), nn.Linear(D, 5))

    def make(i, g):
        labels = torch.randint(0, 5, (4, 6), generator=g)
        if i == 1:
            labels[:] = -100
        return {"tokens": torch.randint(0, 20, (4, 6), generator=g), "labels": labels}

    def loss(m, b):
        logits = m(b["tokens"])
        return F.cross_entropy(logits.reshape(-1, 5), b["labels"].reshape(-1))

    return SimpleNamespace(model=model, loss=loss, batches=_batches(3, make))


# -- pytorch/pytorch#31557: CTC loss of an alignment that cannot exist -------------------------------------------
def ctc_infeasible():
    """Two frames cannot emit "a a" (a repeated label needs a blank between: 3 frames). The CTC likelihood is 0 and
    the loss is -log(0) = +Inf, in float64 too: not an overflow. Expected: loss, aten._ctc_loss.Tensor, inf,
    infeasible_target (a documented cause: the target cannot be aligned)."""
    torch.manual_seed(0)
    model = nn.Linear(D, 4)

    def make(i, g):
        return {"x": torch.randn(2, 3, D, generator=g), "targets": torch.tensor([[1, 2], [3, 3], [2, 1]]),
                "input_lengths": torch.tensor([2, 2, 2]), "target_lengths": torch.tensor([2, 2, 2])}

    def loss(m, b):
        log_probs = m(b["x"]).log_softmax(-1)  # [T, N, C]
        return F.ctc_loss(log_probs, b["targets"], b["input_lengths"], b["target_lengths"])

    return SimpleNamespace(model=model, loss=loss, batches=_batches(2, make))


# -- pytorch/pytorch#103749: padding rows in attention ------------------------------------------------------------
class PaddedAttention(nn.Module):
    """The thread's two implementations: `sdpa` (F.scaled_dot_product_attention with a boolean mask) and the
    naive one (masked_fill(-inf) + softmax). A padding query row has no allowed key."""

    def __init__(self, naive: bool):
        super().__init__()
        self.naive = naive
        self.qkv = nn.Linear(D, 3 * D)

    def forward(self, x, allowed):  # x [B, L, D], allowed [B, L, L]
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if not self.naive:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
        scores = (q @ k.transpose(1, 2)) / D ** 0.5
        return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


def _padded(naive: bool):
    torch.manual_seed(0)
    model = nn.ModuleDict({"attn": PaddedAttention(naive), "head": nn.Linear(D, 1)})

    def make(i, g):
        allowed = torch.tril(torch.ones(6, 6, dtype=torch.bool)).repeat(2, 1, 1)
        allowed[:, 5, :] = False  # the padding query: no key at all
        return {"x": torch.randn(2, 6, D, generator=g), "allowed": allowed, "y": torch.randn(2, 5, generator=g)}

    def loss(m, b):
        out = m["head"](m["attn"](b["x"], b["allowed"])).squeeze(-1)
        return F.mse_loss(out[:, :5], b["y"])  # the padding position is not scored

    return SimpleNamespace(model=model, loss=loss, batches=_batches(2, make))


def sdpa_padding_row():
    """torch >= 2.5 gives fully masked SDPA rows 0 (forward and backward) on CPU: must be clean."""
    return _padded(naive=False)


def naive_padding_row():
    """Expected: forward, module `attn` (PaddedAttention), aten._softmax.default, nan, all_masked_softmax, with
    generic wording (no AAM words)."""
    return _padded(naive=True)


# -- invalid-action masking in a policy head (RL idiom) -------------------------------------------------------
class MaskedPolicy(nn.Module):
    def __init__(self):
        super().__init__()
        self.logits = nn.Linear(D, 5)

    def forward(self, obs, valid):  # valid [B, 5]
        return self.logits(obs).masked_fill(~valid, float("-inf"))  # an output full of -inf, by design


def _policy_task(all_masked_at: int | None):
    torch.manual_seed(0)
    model = nn.ModuleDict({"policy": MaskedPolicy()})

    def make(i, g):
        valid = torch.rand(8, 5, generator=g) > 0.4
        valid[:, 0] = True
        if i == all_masked_at:
            valid[3] = False  # a state with no legal action
        action = torch.multinomial(valid.float() + (~valid.any(-1, keepdim=True)).float(), 1, generator=g)[:, 0]
        return {"obs": torch.randn(8, D, generator=g), "valid": valid, "action": action,
                "advantage": torch.randn(8, generator=g)}

    def loss(m, b):
        dist = Categorical(logits=m["policy"](b["obs"], b["valid"]))
        return -(dist.log_prob(b["action"]) * b["advantage"]).mean() - 0.01 * dist.entropy().mean()

    return SimpleNamespace(model=model, loss=loss, batches=_batches(3, make))


def rl_masked_logits():
    """Healthy: every state keeps a legal action. Clean; the -inf output of `policy` is only a note."""
    return _policy_task(None)


def rl_no_legal_action():
    """Micro-batch 2 has a state with every action masked: logsumexp of all -inf is -inf, and the normalisation
    logits - logsumexp gives -inf - (-inf) = NaN; Categorical's validation then raises. Expected: step 2, the
    NaN born in aten.sub.Tensor (inf_arithmetic), the user's exception recorded."""
    return _policy_task(1)


# -- intentional NaN consumed by nanmean ---------------------------------------------------------------------
def nanmean_padding():
    """Padding positions are set to NaN on purpose and the loss is a nanmean: loss and gradients are finite.
    Must be clean."""
    torch.manual_seed(0)
    model = nn.Linear(D, 1)

    def make(i, g):
        valid = torch.ones(4, 6, dtype=torch.bool)
        valid[:, 4:] = False
        return {"x": torch.randn(4, 6, D, generator=g), "y": torch.randn(4, 6, generator=g), "valid": valid}

    def loss(m, b):
        err = (m(b["x"]).squeeze(-1) - b["y"]) ** 2
        return torch.where(b["valid"], err, torch.full_like(err, float("nan"))).nanmean()

    return SimpleNamespace(model=model, loss=loss, batches=_batches(2, make))


# -- an additive ALiBi/causal bias module whose output holds -inf --------------------------------------------
class AlibiBias(nn.Module):
    """[L, L] bias: -slope * distance below the diagonal, -inf above it (causal)."""

    def __init__(self, length: int):
        super().__init__()
        i = torch.arange(length)
        dist = (i[:, None] - i[None, :]).float()
        self.register_buffer("bias", torch.where(dist >= 0, -0.5 * dist, torch.tensor(float("-inf"))))

    def forward(self):
        return self.bias


class AlibiAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(D, 3 * D)
        self.bias = AlibiBias(6)
        self.head = nn.Linear(D, 1)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        scores = q @ k.transpose(1, 2) / D ** 0.5 + self.bias()
        return self.head(scores.softmax(-1) @ v).squeeze(-1)


def alibi_bias():
    """Healthy: every causal row keeps its diagonal. Must be clean; `bias` output holds -inf in every step."""
    torch.manual_seed(0)
    return SimpleNamespace(model=AlibiAttention(), loss=lambda m, b: F.mse_loss(m(b["x"]), b["y"]), batches=_batches(
        2, lambda i, g: {"x": torch.randn(3, 6, D, generator=g), "y": torch.randn(3, 6, generator=g)}))


# -- std of a single element (correction 1): a batch-variance regulariser on a last batch of one sample ---------
def std_of_one():
    """A VICReg-style variance term `relu(1 - sqrt(var(z, dim=0) + eps))`; the third micro-batch holds ONE sample,
    so var over dim 0 with correction 1 is 0/0. Expected: step 3, loss, aten.var.correction, nan, div_by_zero
    (1 element, correction 1)."""
    torch.manual_seed(0)
    model = nn.Linear(D, 4)

    def make(i, g):
        n = 1 if i == 2 else 6
        return {"x": torch.randn(n, D, generator=g), "y": torch.randn(n, 4, generator=g)}

    def loss(m, b):
        z = m(b["x"])
        spread = F.relu(1 - torch.sqrt(z.var(dim=0) + 1e-4)).mean()
        return F.mse_loss(z, b["y"]) + spread

    return SimpleNamespace(model=model, loss=loss, batches=_batches(3, make))


# -- complex: z / |z| at z = 0 (a phase normalisation) ------------------------------------------------------
class PhaseNorm(nn.Module):
    """Unit-modulus phases of a complex projection; a zero row gives 0/0 in complex64."""

    def __init__(self):
        super().__init__()
        self.re = nn.Linear(D, 4, bias=False)
        self.im = nn.Linear(D, 4, bias=False)

    def forward(self, x):
        z = torch.complex(self.re(x), self.im(x))
        return z / z.abs()


def complex_phase_at_zero():
    """An all-zero input row with bias-free projections makes z = 0 exactly. Expected: forward, module `phase`,
    aten.div.Tensor, kind nan (a complex NaN, not Inf), div_by_zero."""
    torch.manual_seed(0)
    model = nn.ModuleDict({"phase": PhaseNorm()})

    def make(i, g):
        x = torch.randn(4, D, generator=g)
        x[2] = 0.0
        return {"x": x, "y": torch.randn(4, 4, generator=g)}

    def loss(m, b):
        return F.mse_loss(m["phase"](b["x"]).real, b["y"])

    return SimpleNamespace(model=model, loss=loss, batches=_batches(2, make))


def complex_angle_at_zero():
    """angle() at z = 0: torch 2.13 defines its gradient there as 0 (forward and backward finite): clean."""
    torch.manual_seed(0)
    model = nn.ModuleDict({"re": nn.Linear(D, 4, bias=False), "im": nn.Linear(D, 4, bias=False)})

    def loss(m, b):
        z = torch.complex(m["re"](b["x"]), m["im"](b["x"]))
        return F.mse_loss(torch.angle(z), b["y"])

    def make(i, g):
        x = torch.randn(4, D, generator=g)
        x[1] = 0.0
        return {"x": x, "y": torch.randn(4, 4, generator=g)}

    return SimpleNamespace(model=model, loss=loss, batches=_batches(2, make))
