"""Synthesize a coherent BIOM-like table + tree when no data files exist.

Coherent means: the tree's tips are exactly the table's ASV IDs, the ASV sequences evolved along that tree (sister
tips differ by few bases, distant tips by many), and each sample draws its ASVs from one region of the tree, so
UniFrac between samples is meaningful. Sample richness is spread from well under to well over the token limit,
so token-limited batches hold both truncated samples and padding slots. Deterministic under the seed.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from debug_nan.aam.data.loading import Dataset
from debug_nan.aam.data.progress import Phase, human_bytes
from debug_nan.aam.data.tokens import MAX_BASES, tokenize
from debug_nan.errors import InputError
from debug_nan.process.memory import available_bytes

LETTERS = np.frombuffer(b"ACGT", dtype=np.uint8)  # base code 0..3 -> ASCII byte
# Peak memory of synthesize(), measured with /usr/bin/time on CPython 3.11 / skbio 0.7 (48 and 480 samples, token
# limits 2,000 to 100,000): about 1.5 KB per ASV (tree node, sequence, tokens) and 64 bytes per non-zero count.
BYTES_PER_ASV = 1536
BYTES_PER_COUNT = 64


def synthetic_shape(n_samples: int, token_limit: int) -> tuple[int, np.ndarray]:
    """(number of ASVs, richness per sample [S] before shuffling) of the synthetic table."""
    n_asvs = max(3 * token_limit, 64)
    richness = np.linspace(max(1, token_limit // 8), min(2 * token_limit, n_asvs - 1), n_samples).astype(int)
    return n_asvs, richness


def estimate_synthetic_bytes(n_samples: int, token_limit: int) -> int:
    """Peak memory that synthesize(n_samples, token_limit) needs on top of the interpreter, in bytes."""
    n_asvs, richness = synthetic_shape(n_samples, token_limit)
    return int(BYTES_PER_ASV * n_asvs + BYTES_PER_COUNT * int(richness.sum()))


def check_synthetic_fits(n_samples: int, token_limit: int, available: int | None) -> int:
    """The estimate in bytes; InputError when it clearly exceeds the `available` memory (None: unknown)."""
    need = estimate_synthetic_bytes(n_samples, token_limit)
    if available is not None and need > available:
        n_asvs, _ = synthetic_shape(n_samples, token_limit)
        raise InputError(
            f"Synthetic data for --token-limit {token_limit} would need about {human_bytes(need)} of memory "
            f"({n_samples} samples x {n_asvs:,} ASVs: the synthetic table has 3 ASVs per token-limit slot, on a "
            f"random tree), but only {human_bytes(available)} is available. Lower --token-limit (or "
            f"--synthetic-samples), or debug your own data with --data-dir / --table.")
    return need


def random_tree(n_tips: int, rng: np.random.Generator):
    """A random rooted binary tree (random joining), returned as (skbio.TreeNode, tips in DFS order)."""
    from skbio import TreeNode

    nodes = [TreeNode(name=f"t{i}") for i in range(n_tips)]
    while len(nodes) > 1:
        i, j = sorted(rng.choice(len(nodes), size=2, replace=False))
        right, left = nodes.pop(j), nodes.pop(i)
        for child in (left, right):
            child.length = float(rng.exponential(0.05))
        nodes.append(TreeNode(children=[left, right]))
    root = nodes[0]
    return root, list(root.tips())


def evolve_sequences(root, rng: np.random.Generator, rate: float = 1.0) -> None:
    """Give every node a DNA sequence: a random root, then substitutions along each branch (~ length * rate)."""
    length = MAX_BASES
    root.seq = rng.integers(0, 4, size=length, dtype=np.int8)
    for node in root.preorder(include_self=False):
        seq = node.parent.seq.copy()
        n_mut = rng.poisson(node.length * rate * length) + (1 if node.is_tip() else 0)
        pos = rng.integers(0, length, size=n_mut)
        seq[pos] = (seq[pos] + rng.integers(1, 4, size=n_mut)) % 4
        node.seq = seq


def synthesize(n_samples: int, token_limit: int, seed: int, log=None,
               reason: str = "No BIOM table/tree found") -> Dataset:
    """A Dataset of n_samples with richness from ~token_limit/8 to ~2 x token_limit (at least 1).

    First the size is estimated (InputError when it clearly cannot fit in memory), and `log` gets a line with the
    size before the work and one with the time after it: a large token limit takes minutes."""
    need = check_synthetic_fits(n_samples, token_limit, available_bytes())
    n_asvs, richness = synthetic_shape(n_samples, token_limit)
    with Phase(log, f"Synthesizing {n_samples} samples x {n_asvs:,} ASVs (token limit {token_limit}, about "
                    f"{human_bytes(need)} of memory)") as phase:
        data = _synthesize(n_samples, token_limit, seed, reason)
        phase.done(f"Synthesized {n_samples} samples x {n_asvs:,} ASVs ({data.counts.nnz:,} non-zero counts)")
    return data


def _synthesize(n_samples: int, token_limit: int, seed: int, reason: str) -> Dataset:
    rng = np.random.default_rng(seed)
    n_asvs, richness = synthetic_shape(n_samples, token_limit)
    root, tips = random_tree(n_asvs, rng)
    evolve_sequences(root, rng)
    lengths = rng.integers(MAX_BASES - 30, MAX_BASES + 1, size=n_asvs)  # reads of 120-150 bases
    seqs = [LETTERS[tip.seq[:n]].tobytes().decode("ascii") for tip, n in zip(tips, lengths)]
    # sequences must be unique to serve as IDs: nudge rare collisions with one extra substitution
    seen: set[str] = set()
    for k, s in enumerate(seqs):
        while s in seen:
            pos = int(rng.integers(0, len(s)))
            s = s[:pos] + "ACGT"[("ACGT".index(s[pos]) + 1) % 4] + s[pos + 1:]
        seen.add(s)
        seqs[k] = s
    for tip, s in zip(tips, seqs):
        tip.name = s
    for node in root.traverse(include_self=True):
        del node.seq

    rng.shuffle(richness)
    centers = rng.uniform(0, n_asvs, size=n_samples)
    position = np.arange(n_asvs)
    rows, cols, vals = [], [], []
    for s in range(n_samples):
        dist = np.abs(position - centers[s])
        dist = np.minimum(dist, n_asvs - dist)  # circular, so every region is equally used
        weight = np.exp(-dist / (0.15 * n_asvs))
        chosen = rng.choice(n_asvs, size=richness[s], replace=False, p=weight / weight.sum())
        chosen.sort()
        rows.append(np.full(chosen.size, s))
        cols.append(chosen)
        vals.append(np.ceil(rng.lognormal(2.0, 1.2, size=chosen.size)))
    counts = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                           shape=(n_samples, n_asvs))
    tokens, report = tokenize(seqs, seqs)
    sample_ids = [f"S{i + 1}" for i in range(n_samples)]
    note = (f"{reason}: synthesized {n_samples} samples x {n_asvs} ASVs on a random tree "
            f"(seed {seed}), richness {richness.min()}..{richness.max()} ASVs per sample against a token limit "
            f"of {token_limit}.")
    return Dataset(sample_ids=sample_ids, asv_ids=seqs, sequences=seqs, counts=counts, tokens=tokens, tree=root,
                   source="synthetic", token_report=report, notes=[note])
