"""Masked attention building blocks, with the padding guard.

Guards on: a softmax never runs over an empty set, in forward or backward. A row whose keys are all masked
attends uniformly instead, and the caller zeroes that row's output. Zeroing a NaN afterwards (`torch.where`) is
not enough: the NaN is still in the graph and leaks into the gradients.
Guards off: the pre-fix behaviour, an explicit masked softmax that turns an all-masked row into NaN.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


def guard_empty_rows(key_valid: torch.Tensor) -> torch.Tensor:
    """key_valid [..., L] bool -> the same mask where rows with no valid key get every key (no empty softmax)."""
    return key_valid | ~key_valid.any(dim=-1, keepdim=True)


def masked_softmax(scores: torch.Tensor, key_valid: torch.Tensor, guards: bool) -> torch.Tensor:
    """Softmax over the last dim of scores [..., L] where key_valid [..., L] (broadcastable) is True."""
    if guards:
        key_valid = guard_empty_rows(key_valid)
    return torch.softmax(scores.masked_fill(~key_valid, float("-inf")), dim=-1)


class SelfAttention(nn.Module):
    """Multi-head self-attention over x [N, L, D] with a key mask [N, L]."""

    def __init__(self, d_model: int, heads: int, dropout: float, guards: bool):
        super().__init__()
        self.heads = heads
        self.guards = guards
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
        n, length, d = x.shape
        q, k, v = self.qkv(x).view(n, length, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        mask = key_valid[:, None, None, :]  # [N, 1, 1, L]
        p = self.dropout if self.training else 0.0
        if self.guards:
            # fused kernel; the guarded mask never leaves a query row without a key
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=guard_empty_rows(mask), dropout_p=p)
        else:
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
            weights = F.dropout(masked_softmax(scores, mask, guards=False), p, self.training)
            y = weights @ v
        return self.out(y.transpose(1, 2).reshape(n, length, d))


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(ln(x)), then x + mlp(ln(x)) with GELU."""

    def __init__(self, d_model: int, heads: int, ffn_mult: int, dropout: float, guards: bool):
        super().__init__()
        self.ln1 = nn.LayerNorm(d_model)
        self.attn = SelfAttention(d_model, heads, dropout, guards)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, ffn_mult * d_model), nn.GELU(),
                                 nn.Linear(ffn_mult * d_model, d_model), nn.Dropout(dropout))
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
        x = x + self.drop(self.attn(self.ln1(x), key_valid))
        return x + self.mlp(self.ln2(x))


class Transformer(nn.Module):
    """A stack of pre-norm blocks and a final LayerNorm; x [N, L, D], key_valid [N, L] -> [N, L, D]."""

    def __init__(self, layers: int, d_model: int, heads: int, ffn_mult: int, dropout: float, guards: bool):
        super().__init__()
        self.layers = nn.ModuleList(Block(d_model, heads, ffn_mult, dropout, guards) for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, key_valid)
        return self.norm(x)


class TorchTransformer(nn.Module):
    """torch's own nn.TransformerEncoder (pre-norm, GELU, batch_first, a final LayerNorm) behind the same interface:
    x [N, L, D], key_valid [N, L] -> [N, L, D]; padding goes in as src_key_padding_mask = ~key_valid.

    In training it runs the composite path, whose attention gives a query row without any key zeros. Under eval()
    + no_grad (and no forward hooks, no autocast) it takes the inference fast path, the fused
    aten._transformer_encoder_layer_fwd per layer, which turns such a row into NaN: the PYT-8.9 NaN that only the
    validation pass met. (norm_first=True also keeps nested tensors off: with them an all-padding row is dropped and
    comes back as zeros, see the README.)"""

    def __init__(self, layers: int, d_model: int, heads: int, ffn_mult: int, dropout: float):
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model, heads, ffn_mult * d_model, dropout, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, norm=nn.LayerNorm(d_model), enable_nested_tensor=False)

    def forward(self, x: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
        return self.encoder(x, src_key_padding_mask=~key_valid)


class AttentionPooling(nn.Module):
    """One vector per row: softmax-weighted sum over L of x [N, L, D] with a mask [N, L] -> [N, D]."""

    def __init__(self, d_model: int, guards: bool):
        super().__init__()
        self.score = nn.Linear(d_model, 1)
        self.guards = guards

    def forward(self, x: torch.Tensor, key_valid: torch.Tensor) -> torch.Tensor:
        weights = masked_softmax(self.score(x).squeeze(-1), key_valid, self.guards)  # [N, L]
        pooled = (weights.unsqueeze(-1) * x).sum(dim=1)
        if self.guards:
            pooled = pooled * key_valid.any(dim=-1, keepdim=True)  # an empty row pools to zero
        return pooled
