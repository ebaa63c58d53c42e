"""The data rules of the field's own tools (biom-format, scikit-bio, QIIME 2), applied to what was read.

Each rule either raises InputError (exit 2) with one paragraph that names the file, the first few offending
samples / ASVs / tips with their count, and the fix; or, where those tools accept the data with a caveat,
returns a line starting "NOTICE:" for the log. Nothing here reads or writes a file.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import scipy.sparse as sp

from debug_nan.errors import InputError

AMBIGUOUS = "NRYSWKMBDHVnryswkmbdhv"  # IUPAC codes that stand for more than one base
# more than this share of branches without a length is not "a few": the distances would mostly be made up
MAX_SHARE_MISSING_LENGTHS = 0.5


def some(items, n: int = 3, width: int = 40) -> str:
    """"'a', 'b', 'c' and 7 more": the first n items (long ones cut to `width`), then how many were left out."""
    items = list(items)
    shown = ", ".join(repr(i[:width] + "..." if isinstance(i, str) and len(i) > width else i) for i in items[:n])
    return shown + (f" and {len(items) - n} more" if len(items) > n else "")


def counted(n: int, noun: str) -> str:
    """counted(1, 'count') -> '1 count'; counted(3, 'count') -> '3 counts'."""
    return f"{n:,} {noun}" + ("" if n == 1 else "es" if noun.endswith(("ch", "sh", "s", "x")) else "s")


def duplicates(ids) -> dict[str, int]:
    """{id: occurrences} of the IDs that occur more than once, in first-seen order (None ignored)."""
    counts = Counter(i for i in ids if i is not None)
    return {i: c for i, c in counts.items() if c > 1}


def check_unique_ids(ids, what: str, where: str, fix: str) -> None:
    """what: e.g. 'sample ID'; where: e.g. 'BIOM table x.biom'. Raises when an ID occurs twice."""
    dup = duplicates(ids)
    if dup:
        shown = ", ".join(f"{i[:40]!r} ({c} times)" for i, c in list(dup.items())[:3])
        more = f" and {len(dup) - 3} more" if len(dup) > 3 else ""
        raise InputError(f"{where} has {counted(len(dup), 'duplicate ' + what)}: {shown}{more}. Every ID must be "
                         "unique "
                         f"(biom-format, scikit-bio and QIIME 2 refuse duplicates); {fix}")


def _entries(counts: sp.csr_matrix, mask: np.ndarray, sample_ids: list[str], asv_ids: list[str]) -> str:
    """The first few stored entries where mask holds, as "sample 'S1' / ASV 'ACGT...' = nan", and their count."""
    rows = np.repeat(np.arange(counts.shape[0]), np.diff(counts.indptr))[mask]
    cols = counts.indices[mask]
    values = counts.data[mask]
    shown = "; ".join(f"sample {sample_ids[r]!r} / ASV {some([asv_ids[c]], width=30)} = {v:g}"
                      for r, c, v in zip(rows[:3], cols[:3], values[:3]))
    samples = np.unique(rows).size
    return f"{counted(int(mask.sum()), 'count')} in {counted(samples, 'sample')}, e.g. {shown}"


def check_counts(counts: sp.csr_matrix, sample_ids: list[str], asv_ids: list[str], path) -> list[str]:
    """counts: CSR [S, N] as read. NaN/Inf or negative counts raise; fractional counts are a NOTICE."""
    counts = counts.tocsr()
    data = counts.data
    bad = ~np.isfinite(data)
    if bad.any():
        raise InputError(
            f"BIOM table {path} holds non-finite counts (NaN or Inf): {_entries(counts, bad, sample_ids, asv_ids)}. "
            f"A count is a number of reads; a NaN/Inf usually comes from a division by a zero total upstream "
            f"(e.g. a relative-abundance table made from an empty sample). Remove or recompute those samples "
            f"(e.g. `qiime feature-table filter-samples`) before debugging the model.")
    negative = data < 0
    if negative.any():
        raise InputError(
            f"BIOM table {path} holds negative counts: {_entries(counts, negative, sample_ids, asv_ids)}. "
            f"Counts must be >= 0 (UniFrac and rarefaction have no meaning for negative abundances); a "
            f"centered or log-ratio transformed table (CLR) is not a count table: pass the raw feature table.")
    fractional = data != np.rint(data)
    if fractional.any():
        return [f"NOTICE: BIOM table {path} holds fractional counts "
                f"({_entries(counts, fractional, sample_ids, asv_ids)})"
                f", as a relative-frequency table does: accepted. Unweighted UniFrac uses only presence/absence, so "
                f"the values do not change it; weighted UniFrac uses each sample's proportions."]
    return []


def _node_label(node) -> str:
    if node.name:
        return repr(node.name[:40] + "..." if len(node.name) > 40 else node.name)
    tips = [t.name for t in node.tips()][:2]
    return f"the internal node above {some(tips, 2, 30)}"


def _branches(nodes, mask, n: int = 3, with_length: bool = True) -> str:
    picked = [node for node, m in zip(nodes, mask) if m]
    shown = ", ".join(_node_label(node) + (f" ({node.length:g})" if with_length else "") for node in picked[:n])
    return shown + (f" and {len(picked) - n} more" if len(picked) > n else "")


def check_tree(tree, path) -> list[str]:
    """Unique tip names; finite, non-negative branch lengths that are not all zero or all missing.

    Branches without a length (a few) are set to 0 on this in-memory tree, so every UniFrac backend sees the same
    tree, and reported as a NOTICE."""
    check_unique_ids((t.name for t in tree.tips()), "tip name", f"Tree {path}",
                     "rename them (each tip is one ASV) or rebuild the tree from the table's sequences.")
    nodes = list(tree.traverse(include_self=False))  # the root's own length is no branch of the tree
    if not nodes:
        raise InputError(f"Tree {path} is a single node; UniFrac needs a tree with the table's ASVs as tips.")
    missing = np.array([n.length is None for n in nodes])
    lengths = np.array([np.nan if n.length is None else n.length for n in nodes], dtype=np.float64)
    nonfinite = ~missing & ~np.isfinite(lengths)
    if nonfinite.any():
        raise InputError(f"Tree {path} has {counted(int(nonfinite.sum()), 'non-finite branch length')} (NaN or Inf): "
                         f"{_branches(nodes, nonfinite)}. UniFrac sums branch lengths, so every distance would be "
                         f"non-finite; fix or rebuild the tree.")
    negative = ~missing & (lengths < 0)
    if negative.any():
        raise InputError(f"Tree {path} has {counted(int(negative.sum()), 'negative branch length')}: "
                         f"{_branches(nodes, negative)}. "
                         f"UniFrac sums branch lengths, so distances would fall outside 0..1 (scikit-bio refuses such "
                         f"a tree). Neighbor-joining can produce them: rebuild the tree (e.g. QIIME 2 `phylogeny "
                         f"align-to-tree-mafft-fasttree`) or set those lengths to 0.")
    if missing.all():
        raise InputError(f"Tree {path} has no branch lengths (a topology only, {len(nodes)} branches): UniFrac "
                         f"weighs every branch by its length, so every distance would be 0. Use a tree with branch "
                         f"lengths (e.g. QIIME 2 `phylogeny align-to-tree-mafft-fasttree`).")
    if not np.any(lengths[~missing] > 0):
        raise InputError(f"Tree {path}: all {len(nodes)} branch lengths are 0, so every UniFrac distance would be 0 "
                         f"and the targets carry no signal. Use a tree with branch lengths (e.g. QIIME 2 `phylogeny "
                         f"align-to-tree-mafft-fasttree`).")
    if missing.mean() > MAX_SHARE_MISSING_LENGTHS:
        raise InputError(f"Tree {path}: {int(missing.sum())} of its {len(nodes)} branches have no length "
                         f"({_branches(nodes, missing, with_length=False)}); with most lengths missing the UniFrac "
                         f"distances would be made up. Use a tree with branch lengths for every branch.")
    if missing.any():
        for node, m in zip(nodes, missing):
            if m:
                node.length = 0.0
        return [f"NOTICE: Tree {path}: {int(missing.sum())} of its {len(nodes)} branches have no length "
                f"({_branches(nodes, missing, with_length=False)}); they are treated as 0 (they add nothing to any "
                f"distance). scikit-bio's validated UniFrac refuses such a tree; give every branch a length to "
                f"silence this."]
    return []


def check_tree_length(tree, path, n_tips: int) -> None:
    """After shearing to the table's ASVs: the branches left must have some length, else every target is 0."""
    total = sum(n.length or 0.0 for n in tree.traverse(include_self=False))
    if not total > 0:
        raise InputError(f"Tree {path}: the branches that connect the table's {n_tips} ASVs all have length 0, so "
                         f"every UniFrac distance would be 0 and the targets carry no signal. Use a tree with branch "
                         f"lengths for these ASVs (e.g. QIIME 2 `phylogeny align-to-tree-mafft-fasttree`).")


def check_sequences(ids: list[str], sequences: list[str], source) -> None:
    """Empty sequences, alignment gaps and sequences made only of ambiguous bases (N, R, Y, ...) raise."""
    empty = [i for i, s in zip(ids, sequences) if not s]
    if empty:
        raise InputError(f"{source}: {counted(len(empty), 'ASV')} with an empty sequence: {some(empty)}. Every ASV "
                         "needs its "
                         f"DNA sequence (QIIME 2 refuses empty sequences); remove those features or fix the file.")
    gapped = [i for i, s in zip(ids, sequences) if "-" in s or "." in s]
    if gapped:
        raise InputError(f"{source}: {counted(len(gapped), 'ASV sequence')} with alignment gaps ('-' or '.'): "
                         f"{some(gapped)}. These look like aligned sequences (QIIME 2's aligned-dna-sequences); pass "
                         f"the unaligned ones (dna-sequences.fasta from `qiime tools export` of the rep-seqs).")
    ambiguous = [i for i, s in zip(ids, sequences) if not s.strip(AMBIGUOUS)]
    if ambiguous:
        raise InputError(f"{source}: {counted(len(ambiguous), 'ASV sequence')} made only of ambiguous bases (N, R, Y, "
                         f"...): "
                         f"{some(ambiguous)}. They carry no nucleotide to learn from and tokenise to padding only; "
                         f"remove those features (e.g. `qiime feature-table filter-features`).")
