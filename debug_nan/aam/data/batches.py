"""Token-limited, truncating collate (AAM style) and the per-batch data checks.

A batch is a dict:
  tokens     int64   [B, A, 151]   A = token_limit ASV slots; unused slots are all-zero rows (padding)
  counts     float32 [B, A]        read counts of the kept ASVs (0 in padding slots)
  unifrac    float32 [B, B]        UniFrac sub-matrix in batch order
  used_slots int64   [N]           flat indices (b * A + a) of the slots that hold an ASV, computed on the host
                                   so the model can pack them without a device sync
  sample_ids list[str]             B sample IDs
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from debug_nan.aam.data.loading import Dataset
from debug_nan.aam.data.tokens import ASV_LEN, START, VOCAB_SIZE


def select_asvs(asv_idx: np.ndarray, counts: np.ndarray, token_limit: int, order: str,
                rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Keep at most token_limit of one sample's ASVs: table order (`first`), most abundant, or random."""
    if order == "abundance":
        keep = np.argsort(-counts, kind="stable")
    elif order == "random":
        keep = rng.permutation(asv_idx.size)
    else:
        keep = np.arange(asv_idx.size)
    keep = keep[:token_limit]
    return asv_idx[keep], counts[keep]


class Collator:
    """Turns lists of sample indices into batches; the whole token matrix is gathered with numpy fancy indexing."""

    def __init__(self, data: Dataset, distances: np.ndarray, token_limit: int, order: str = "first", seed: int = 0):
        self.data = data
        self.distances = distances
        self.token_limit = token_limit
        self.order = order
        self.rng = np.random.default_rng(seed)

    def __call__(self, sample_idx: list[int] | np.ndarray) -> dict:
        sample_idx = np.asarray(sample_idx)
        b, a = sample_idx.size, self.token_limit
        csr = self.data.counts
        rows, cols, slot_counts = [], [], []
        for row, s in enumerate(sample_idx):
            lo, hi = csr.indptr[s], csr.indptr[s + 1]
            idx, cnt = select_asvs(csr.indices[lo:hi], csr.data[lo:hi], a, self.order, self.rng)
            rows.append(np.full(idx.size, row))
            cols.append(idx)
            slot_counts.append(cnt)
        n_kept = np.array([c.size for c in cols])
        row = np.concatenate(rows).astype(np.int64)
        slot = np.concatenate([np.arange(n) for n in n_kept]).astype(np.int64)
        asv = np.concatenate(cols).astype(np.int64)
        tokens = np.zeros((b, a, ASV_LEN), dtype=np.int64)
        tokens[row, slot] = self.data.tokens[asv]
        counts = np.zeros((b, a), dtype=np.float32)
        counts[row, slot] = np.concatenate(slot_counts)
        unifrac = self.distances[np.ix_(sample_idx, sample_idx)].astype(np.float32)
        return {
            "tokens": torch.from_numpy(tokens),
            "counts": torch.from_numpy(counts),
            "unifrac": torch.from_numpy(unifrac),
            "used_slots": torch.from_numpy(row * a + slot),
            "sample_ids": [self.data.sample_ids[s] for s in sample_idx],
        }


@dataclass
class BatchCheck:
    """The data checks of one batch; `problems` lists what is wrong (empty = all good)."""

    shape: tuple
    start_preserved: bool
    token_min: int
    token_max: int
    padding_slots: list[int]
    empty_samples: list[str]
    target_finite: bool
    problems: list[str] = field(default_factory=list)

    def lines(self) -> list[str]:
        pads = self.padding_slots
        slots = self.shape[1]
        return [
            f"tokens {list(self.shape)}: token range {self.token_min}..{self.token_max} (vocab 0..{VOCAB_SIZE - 1}), "
            f"START kept in every used ASV slot: {'yes' if self.start_preserved else 'NO'}",
            f"all-padding ASV slots per sample: {pads} of {slots} (min {min(pads)}, max {max(pads)}); "
            f"empty samples: {', '.join(self.empty_samples) if self.empty_samples else 'none'}; "
            f"UniFrac target finite: {'yes' if self.target_finite else 'NO'}",
        ]


def check_batch(batch: dict) -> BatchCheck:
    """Vectorised checks: START preserved after truncation, token range, padding slots, empty samples, target."""
    tokens = batch["tokens"]
    used = tokens.ne(0).any(dim=-1)  # [B, A] slot holds an ASV
    start_ok = bool(tokens[..., 0].eq(START).eq(used).all())
    tmin, tmax = int(tokens.min()), int(tokens.max())
    padding = (~used).sum(dim=1).tolist()
    empty = [sid for sid, n in zip(batch["sample_ids"], used.sum(dim=1).tolist()) if n == 0]
    target_finite = bool(torch.isfinite(batch["unifrac"]).all())
    problems = []
    if not start_ok:
        problems.append("START token missing at position 0 of a used ASV slot (truncation cut it off?)")
    if tmin < 0 or tmax >= VOCAB_SIZE:
        problems.append(f"token values outside 0..{VOCAB_SIZE - 1}: {tmin}..{tmax}")
    if empty:
        problems.append(f"samples with no ASV left: {', '.join(empty)}")
    if not target_finite:
        problems.append("UniFrac target holds NaN/Inf")
    return BatchCheck(tuple(tokens.shape), start_ok, tmin, tmax, padding, empty, target_finite, problems)
