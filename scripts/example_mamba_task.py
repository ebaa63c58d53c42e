"""Example --task plug-in: a small Mamba-style selective-scan language model.

    debug-nan --task scripts/example_mamba_task.py:build --max-steps 5          # finds the overflow
    debug-nan --task scripts/example_mamba_task.py:build_fixed --max-steps 5    # clean

The bug is a classic one: the state matrix must be negative (A = -exp(A_log)) so that the discretised
transition exp(dt * A) stays below 1. `build` forgets the minus sign, the state grows like exp(t), and the
recurrence overflows float32 part-way along the sequence.
"""

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn


class SelectiveScan(nn.Module):
    """x [B, T, D] -> [B, T, D]: h_t = exp(dt_t * A) * h_{t-1} + dt_t * B_t * x_t, y_t = <C_t, h_t>."""

    def __init__(self, d_model: int, d_state: int, negative_a: bool):
        super().__init__()
        self.in_proj = nn.Linear(d_model, d_model)
        self.to_dt = nn.Linear(d_model, d_model)
        self.to_b = nn.Linear(d_model, d_state)
        self.to_c = nn.Linear(d_model, d_state)
        self.a_log = nn.Parameter(torch.log(torch.linspace(1.0, 16.0, d_state)).repeat(d_model, 1))
        self.negative_a = negative_a
        self.out_proj = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        u = F.silu(self.in_proj(x))
        dt = F.softplus(self.to_dt(x))  # [B, T, D] > 0
        a = -torch.exp(self.a_log) if self.negative_a else torch.exp(self.a_log)  # [D, N]
        b, c = self.to_b(x), self.to_c(x)  # [B, T, N]
        h = x.new_zeros(x.shape[0], x.shape[2], a.shape[1])  # [B, D, N]
        ys = []
        for t in range(x.shape[1]):
            decay = torch.exp(dt[:, t, :, None] * a)  # [B, D, N]
            h = decay * h + dt[:, t, :, None] * b[:, t, None, :] * u[:, t, :, None]
            ys.append((h * c[:, t, None, :]).sum(-1))
        return self.out_proj(torch.stack(ys, dim=1))


class MambaLM(nn.Module):
    def __init__(self, vocab: int = 32, d_model: int = 32, d_state: int = 8, layers: int = 2, negative_a=True):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.layers = nn.ModuleList(SelectiveScan(d_model, d_state, negative_a) for _ in range(layers))
        self.norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(layers))
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for norm, layer in zip(self.norms, self.layers):
            x = x + layer(norm(x))
        return self.head(x)


def _task(settings, negative_a: bool):
    torch.manual_seed(settings.seed)
    g = torch.Generator().manual_seed(settings.seed)
    batches = [{"tokens": torch.randint(0, 32, (4, 48), generator=g)} for _ in range(8)]

    def loss(model, batch):
        logits = model(batch["tokens"][:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["tokens"][:, 1:].reshape(-1))

    return SimpleNamespace(model=MambaLM(negative_a=negative_a), batches=batches, loss=loss)


def build(settings):
    return _task(settings, negative_a=False)


def build_fixed(settings):
    return _task(settings, negative_a=True)
