"""Built-in model presets for scripts/bench_overhead.py (no downloads): a deep narrow stack and a GPT-2-like LM.

    deep   24 pre-norm transformer blocks, d 64, 4 heads, seq 64, batch 8, vocab 256   (295 modules)
    gpt2   6 blocks, d 384, 6 heads, seq 128, batch 4, vocab 8192 (GPT-2-small's block at a third of the depth
           and a smaller vocabulary, so that a CPU step stays under a second)                 (79 modules)
    tiny   2 blocks, d 32, 2 heads, seq 16, batch 4, vocab 64: the stand-in for both in smoke runs
           (scripts/gpu_check.py --quick)

Each preset is a task like any `--task` plug-in: model, one fixed batch of token ids, next-token cross-entropy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from debug_nan.drivers.task import Task


@dataclass(frozen=True)
class LMShape:
    blocks: int
    d_model: int
    heads: int
    seq: int
    batch: int
    vocab: int


PRESETS = {
    "deep": LMShape(blocks=24, d_model=64, heads=4, seq=64, batch=8, vocab=256),
    "gpt2": LMShape(blocks=6, d_model=384, heads=6, seq=128, batch=4, vocab=8192),
    "tiny": LMShape(blocks=2, d_model=32, heads=2, seq=16, batch=4, vocab=64),
}


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(d, 3 * d)
        self.c_proj = nn.Linear(d, d)
        self.resid_dropout = nn.Dropout(dropout)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [B, T, D] -> [B, T, D]."""
        b, t, d = x.shape
        q, k, v = self.c_attn(x).view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=self.dropout if self.training else 0.0)
        return self.resid_dropout(self.c_proj(y.transpose(1, 2).reshape(b, t, d)))


class MLP(nn.Module):
    def __init__(self, d: int, dropout: float):
        super().__init__()
        self.c_fc = nn.Linear(d, 4 * d)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * d, d)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.ln_1 = nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads, dropout)
        self.ln_2 = nn.LayerNorm(d)
        self.mlp = MLP(d, dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    def __init__(self, shape: LMShape, dropout: float = 0.1):
        super().__init__()
        d = shape.d_model
        self.wte = nn.Embedding(shape.vocab, d)
        self.wpe = nn.Embedding(shape.seq, d)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(Block(d, shape.heads, dropout) for _ in range(shape.blocks))
        self.ln_f = nn.LayerNorm(d)
        self.lm_head = nn.Linear(d, shape.vocab, bias=False)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        """idx [B, T] token ids -> logits [B, T, vocab]."""
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def lm_loss(model: nn.Module, batch: dict) -> torch.Tensor:
    logits = model(batch["idx"])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch["targets"].reshape(-1))


def build_lm_task(name: str, seed: int = 0) -> Task:
    """The preset `name` as a task: a seeded model and one batch of random token ids (AdamW from the settings)."""
    shape = PRESETS[name]
    torch.manual_seed(seed)
    model = TinyGPT(shape)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, shape.vocab, (shape.batch, shape.seq + 1), generator=g)
    batch = {"idx": tokens[:, :-1].contiguous(), "targets": tokens[:, 1:].contiguous()}
    return Task(model=model, batches=[batch], loss=lm_loss, name=name)
