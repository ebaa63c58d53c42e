"""AAM-style reference model: nucleotides -> ASV vectors -> sample vector -> UniFrac distances.

Shapes: B samples, A = token_limit ASV slots, L = 151 token positions, D = d_model.
  tokens [B, A, L] -> ASVEncoder -> asv vectors [B, A, D] and nucleotide logits [B, A, L, 6]
                   -> SampleEncoder -> sample vectors [B, D] -> UniFracHead -> distances [B, B]
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from debug_nan.aam.data.tokens import ASV_LEN, PAD, VOCAB_SIZE
from debug_nan.aam.model.attention import AttentionPooling, TorchTransformer, Transformer


@dataclass
class AAMConfig:
    token_limit: int = 512
    d_model: int = 128
    heads: int = 4
    asv_layers: int = 2
    sample_layers: int = 2
    encoder_layers: int = 2
    ffn_mult: int = 4
    dropout: float = 0.1
    guards: bool = True
    asv_encoder: str = "builtin"  # "torch": nn.TransformerEncoder over the nucleotides of each ASV
    asv_chunk_size: int | None = None

    @classmethod
    def from_settings(cls, settings) -> "AAMConfig":
        """The model's fields, read by name from the built-in task's settings (aam/settings.py AAMSettings: the
        token limit from its data, the rest from its model)."""
        return cls(token_limit=settings.data.token_limit,
                   **{f.name: getattr(settings.model, f.name) for f in fields(cls) if f.name != "token_limit"})


class ASVEncoder(nn.Module):
    """tokens [B, A, L] -> (asv vectors [B, A, D], nucleotide logits [B, A, L, 6]).

    Guards on: only slots that hold an ASV are encoded (packed), so an all-padding slot never reaches a softmax.
    Guards off: every slot is encoded, as before the PYT-8.9 fix; all-padding slots turn into NaN.
    asv_encoder "torch": the transformer is nn.TransformerEncoder and the pooling always guarded, as in the AAM
    code of PYT-8.9: training stays finite even with every slot encoded, and only the eval pass (the fused
    inference fast path) turns all-padding slots into NaN.
    With asv_chunk_size, packed ASVs go through in chunks under activation checkpointing, which bounds the
    encoder's peak activation memory by the chunk instead of by B x A.
    """

    def __init__(self, cfg: AAMConfig):
        super().__init__()
        self.cfg = cfg
        self.token_embedding = nn.Embedding(VOCAB_SIZE, cfg.d_model)
        self.position_embedding = nn.Embedding(ASV_LEN, cfg.d_model)
        if cfg.asv_encoder == "torch":
            self.transformer = TorchTransformer(cfg.asv_layers, cfg.d_model, cfg.heads, cfg.ffn_mult, cfg.dropout)
        else:
            self.transformer = Transformer(cfg.asv_layers, cfg.d_model, cfg.heads, cfg.ffn_mult, cfg.dropout,
                                           cfg.guards)
        self.pooling = AttentionPooling(cfg.d_model, cfg.guards or cfg.asv_encoder == "torch")
        self.nucleotide_head = nn.Linear(cfg.d_model, VOCAB_SIZE)

    def encode_rows(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """rows [N, L] -> (pooled [N, D], logits [N, L, 6])."""
        valid = rows.ne(PAD)
        positions = torch.arange(rows.shape[1], device=rows.device)
        x = self.token_embedding(rows) + self.position_embedding(positions)
        x = self.transformer(x, valid)
        return self.pooling(x, valid), self.nucleotide_head(x)

    def forward(self, tokens: torch.Tensor, used_slots: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """used_slots [N]: flat indices of the slots holding an ASV (from the collate); found here if absent,
        at the cost of a device sync."""
        b, a, length = tokens.shape
        rows = tokens.reshape(b * a, length)
        if not self.cfg.guards:
            pooled, logits = self.encode_rows(rows)
            return pooled.view(b, a, -1), logits.view(b, a, length, VOCAB_SIZE)
        used = used_slots if used_slots is not None else rows.ne(PAD).any(dim=1).nonzero().squeeze(1)
        packed = rows.index_select(0, used)
        chunk = self.cfg.asv_chunk_size
        if chunk and packed.shape[0] > chunk:
            parts = [checkpoint(self.encode_rows, piece, use_reentrant=False) if torch.is_grad_enabled()
                     else self.encode_rows(piece) for piece in packed.split(chunk)]
            pooled = torch.cat([p for p, _ in parts])
            logits = torch.cat([lg for _, lg in parts])
        else:
            pooled, logits = self.encode_rows(packed)
        d = pooled.shape[-1]
        asv = pooled.new_zeros(b * a, d).index_copy(0, used, pooled)
        full_logits = logits.new_zeros(b * a, length, VOCAB_SIZE).index_copy(0, used, logits)
        return asv.view(b, a, d), full_logits.view(b, a, length, VOCAB_SIZE)


class SampleEncoder(nn.Module):
    """asv vectors [B, A, D] + slot mask [B, A] -> sample vectors [B, D].

    A slot position embedding, a transformer over the ASVs of each sample, an encoder transformer, and attention
    pooling to one vector per sample."""

    def __init__(self, cfg: AAMConfig):
        super().__init__()
        self.slot_embedding = nn.Embedding(cfg.token_limit, cfg.d_model)
        self.transformer = Transformer(cfg.sample_layers, cfg.d_model, cfg.heads, cfg.ffn_mult, cfg.dropout,
                                       cfg.guards)
        self.encoder = Transformer(cfg.encoder_layers, cfg.d_model, cfg.heads, cfg.ffn_mult, cfg.dropout,
                                   cfg.guards)
        self.pooling = AttentionPooling(cfg.d_model, cfg.guards)

    def forward(self, asv: torch.Tensor, slot_used: torch.Tensor) -> torch.Tensor:
        slots = torch.arange(asv.shape[1], device=asv.device)
        x = self.transformer(asv + self.slot_embedding(slots), slot_used)
        x = self.encoder(x, slot_used)
        return self.pooling(x, slot_used)


class UniFracHead(nn.Module):
    """sample vectors [B, D] -> predicted UniFrac distances [B, B] (Euclidean distance of projections).

    The square root is taken of max(d^2, 1e-12) in float32 (under fp16 autocast 1e-12 would round to 0): its
    derivative stays finite on the diagonal, where d = 0."""

    def __init__(self, d_model: int):
        super().__init__()
        self.proj = nn.Linear(d_model, d_model)

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        z = self.proj(z).float()
        d2 = (z.unsqueeze(1) - z.unsqueeze(0)).pow(2).sum(-1)
        return d2.clamp_min(1e-12).sqrt()


class AAMModel(nn.Module):
    """tokens [B, A, L] (+ used_slots [N]) -> {"unifrac": [B, B], "nucleotides": [B, A, L, 6], "sample": [B, D]}."""

    def __init__(self, cfg: AAMConfig):
        super().__init__()
        self.cfg = cfg
        self.asv_encoder = ASVEncoder(cfg)
        self.sample_encoder = SampleEncoder(cfg)
        self.unifrac_head = UniFracHead(cfg.d_model)

    def forward(self, tokens: torch.Tensor, used_slots: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        asv, nucleotides = self.asv_encoder(tokens, used_slots)
        slot_used = tokens.ne(PAD).any(dim=-1)
        sample = self.sample_encoder(asv, slot_used)
        return {"unifrac": self.unifrac_head(sample), "nucleotides": nucleotides, "sample": sample}
