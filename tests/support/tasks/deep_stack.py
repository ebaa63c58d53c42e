"""--task plug-ins with the depth of a 7B Llama at toy width: 32 blocks of (RMSNorm, q/k/v/o projections, RMSNorm,
gate/up/down projections), 291 modules that own parameters. For the history table (one screen at any depth), the
log width and the TensorBoard export (tests/unit/presentation/, tests/e2e/cli/)."""

import torch
import torch.nn.functional as F
from torch import nn

BLOCKS, D, SEQ, VOCAB = 32, 16, 8, 32


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (nn.Linear(D, D, bias=False) for _ in range(4))

    def forward(self, x):
        """x [B, T, D] -> [B, T, D], causal, 2 heads."""
        b, t, _ = x.shape
        q, k, v = (p(x).view(b, t, 2, D // 2).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(y.transpose(1, 2).reshape(b, t, D))


class MLP(nn.Module):
    def __init__(self, log_gate: bool):
        super().__init__()
        self.gate_proj, self.up_proj = nn.Linear(D, 2 * D, bias=False), nn.Linear(D, 2 * D, bias=False)
        self.down_proj = nn.Linear(2 * D, D, bias=False)
        self.log_gate = log_gate  # the bug of build_log_gate: log of a gate that is negative half the time

    def forward(self, x):
        gate = self.gate_proj(x)
        gate = torch.log(gate) if self.log_gate else F.silu(gate)
        return self.down_proj(gate * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, log_gate: bool = False):
        super().__init__()
        self.input_layernorm, self.post_attention_layernorm = nn.RMSNorm(D), nn.RMSNorm(D)
        self.self_attn, self.mlp = Attention(), MLP(log_gate)

    def forward(self, x):
        x = x + self.self_attn(self.input_layernorm(x))
        return x + self.mlp(self.post_attention_layernorm(x))


class DeepLM(nn.Module):
    def __init__(self, bad_block: int | None = None):
        super().__init__()
        torch.manual_seed(0)
        self.embed_tokens = nn.Embedding(VOCAB, D)
        self.layers = nn.ModuleList(Block(k == bad_block) for k in range(BLOCKS))
        self.norm = nn.RMSNorm(D)
        self.lm_head = nn.Linear(D, VOCAB, bias=False)

    def forward(self, idx):
        """idx [B, T] -> logits [B, T, VOCAB]."""
        x = self.embed_tokens(idx)
        for block in self.layers:
            x = block(x)
        return self.lm_head(self.norm(x))


def _loss(model, batch):
    logits = model(batch["idx"])
    return F.cross_entropy(logits.reshape(-1, VOCAB), batch["targets"].reshape(-1))


def _batches():
    g = torch.Generator().manual_seed(1)
    out = []
    for _ in range(2):
        tokens = torch.randint(0, VOCAB, (2, SEQ + 1), generator=g)
        out.append({"idx": tokens[:, :-1], "targets": tokens[:, 1:]})
    return out


def build():
    """Healthy: every step clean."""
    return {"model": DeepLM(), "batches": _batches(), "loss": _loss}


def build_log_gate():
    """Block 17's MLP takes the log of its gate (negative half the time): NaN in step 1's forward."""
    return {"model": DeepLM(bad_block=17), "batches": _batches(), "loss": _loss}
