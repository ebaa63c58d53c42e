"""The built-in UniFrac engine: exact (scikit-bio's numbers), sparse-aware, one code path for every size.

Conventions, as scikit-bio's `beta_diversity(..., validate=False)`: every node's own branch length counts, the
root's included (a missing or NaN length is 0); the top node is the root even when it has three or more children
(an unrooted Newick); unweighted UniFrac is unique / observed branch length over the nodes a sample reaches
(0 when nothing observed has length); weighted normalized UniFrac is sum_n b_n |p_un - p_vn| divided by
sum_tips depth_t (p_ut + p_vt) with the root's length in every depth, 0 for two empty samples, NaN (0/0) when
the normaliser is 0 otherwise.

How it scales. A sample reaches a few thousand of a large tree's nodes, so node abundances are a sparse
[S, nodes] matrix (counts @ ancestors). Each pair's sums run over the nodes both samples reach, and nodes differ
enormously in how many samples reach them: the few near the root are reached by nearly all, most by a handful.
Nodes are split by that coverage, with a cost model: a well-covered node is cheaper as a dense column (BLAS for
the unweighted shared length, a vectorised L1 for weighted), a rarely covered one as the pairs that share it
(a sparse product, or an enumeration of the sharing pairs). The [S, S] result is filled in row blocks, each
block written to both triangles. Node abundances are built per chunk of samples and split at once, so memory
holds the sparse columns, the dense ones (capped at DENSE_BYTES; bytes for unweighted) and one block, never a
whole [S, nodes] matrix.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from debug_nan.errors import InputError
from debug_nan.process.memory import available_bytes, size_text

# Cost of one (pair, node) term, in relative units measured on a 2-core CPU: a dense column in a BLAS product,
# a dense column in a vectorised L1 distance, one sharing pair in a sparse product / enumeration.
DENSE_COST = {"unweighted": 0.15, "weighted": 1.2}
SPARSE_COST = {"unweighted": 20.0, "weighted": 40.0}
DENSE_BYTES = 256 * 2**20  # memory allowed for the dense columns of all samples
ROW_BLOCK_ELEMENTS = 2**21  # one row block's [rows, S] float64 result (16 MiB)
PAIRS_PER_CHUNK = 2**22  # sharing pairs enumerated at once (weighted, sparse nodes)
UNWEIGHTED_TILE = 1024  # rows x columns of one unweighted tile


@dataclass
class TreeArrays:
    """The tree as arrays, nodes in postorder (root last).

    parent int64 [nodes] (-1 at the root); length float64 [nodes] (None/NaN -> 0, root's own length kept);
    ancestors CSR [F, nodes]: feature f -> its tip and every node above it; depth float64 [F]: root-to-tip
    length of each feature, the root's own length included (scikit-bio's normaliser)."""

    parent: np.ndarray
    length: np.ndarray
    ancestors: sp.csr_matrix
    depth: np.ndarray
    root_children: int

    @property
    def n_nodes(self) -> int:
        return self.parent.size


PATH_ENTRY_BYTES = 48  # building the ancestors CSR: rows + cols (int64) twice, then the COO -> CSR copies


def path_lengths(parent: np.ndarray) -> np.ndarray:
    """int64 [nodes]: how many nodes each node's path to the root holds (itself and the root included), by pointer
    jumping: log2(depth) vectorised rounds, no Python loop over nodes and no path stored."""
    hops = (parent >= 0).astype(np.int64)  # hops from each node to `up`
    up = parent.copy()
    while True:
        has = np.flatnonzero(up >= 0)
        if not has.size:
            return hops + 1
        further = up[has]
        hops[has] += hops[further]  # fancy indexing reads the old values of every node at once
        up[has] = up[further]


def _check_path_memory(parent: np.ndarray, tips: np.ndarray) -> None:
    """A very deep (caterpillar) tree makes the tip-to-root paths n^2 / 2 entries: say so before building them
    past the memory there is (InputError), instead of being killed by the kernel."""
    levels = path_lengths(parent)
    entries = int(levels[tips].sum())
    need, available = entries * PATH_ENTRY_BYTES, available_bytes()
    if available is not None and need > available:
        raise InputError(
            f"The tree is {int(levels.max()):,} nodes deep: the tip-to-root paths of the table's {tips.size:,} ASVs "
            f"that UniFrac needs hold {entries:,} entries (about {size_text(need)} to build), more than the "
            f"{size_text(available)} of memory this machine can give. A tree this deep is a caterpillar (ladder); "
            f"use a less deep tree for these ASVs (e.g. one built by FastTree or a tree builder), or a table with "
            f"fewer ASVs.")


def tree_arrays(tree, feature_ids: list[str]) -> TreeArrays:
    """TreeArrays for skbio.TreeNode `tree` with features in feature_ids order; KeyError naming absent tips."""
    nodes = list(tree.postorder(include_self=True))
    index = {id(node): k for k, node in enumerate(nodes)}
    parent = np.array([index[id(n.parent)] if n.parent is not None else -1 for n in nodes], dtype=np.int64)
    length = np.array([np.nan if n.length is None else float(n.length) for n in nodes], dtype=np.float64)
    length[np.isnan(length)] = 0.0
    tip_of = {n.name: k for k, n in enumerate(nodes) if not n.children}
    missing = [f for f in feature_ids if f not in tip_of]
    if missing:
        raise KeyError(f"the tree has no tip for {len(missing)} of {len(feature_ids)} features, e.g. "
                       f"{', '.join(map(repr, missing[:3]))}")
    node = np.array([tip_of[f] for f in feature_ids], dtype=np.int64)
    _check_path_memory(parent, node)
    rows, cols = [], []
    feature = np.arange(len(feature_ids))
    while feature.size:  # one tree level per iteration: every feature climbs one node
        rows.append(feature)
        cols.append(node)
        up = parent[node] >= 0
        feature, node = feature[up], parent[node[up]]
    rows_all, cols_all = np.concatenate(rows), np.concatenate(cols)
    ancestors = sp.csr_matrix((np.ones(rows_all.size), (rows_all, cols_all)), shape=(len(feature_ids), len(nodes)))
    depth = np.bincount(rows_all, weights=length[cols_all], minlength=len(feature_ids))
    return TreeArrays(parent, length, ancestors, depth, len(tree.children))


def _split_nodes(coverage: np.ndarray, n_samples: int, metric: str, bytes_per_value: int) -> np.ndarray:
    """Boolean [nodes]: which nodes go dense (cheaper as a column than as their sharing pairs), most covered
    first within the DENSE_BYTES budget."""
    worth = coverage.astype(np.float64) ** 2 * SPARSE_COST[metric] > float(n_samples) ** 2 * DENSE_COST[metric]
    budget = DENSE_BYTES // max(1, n_samples * bytes_per_value)
    dense = np.zeros(coverage.size, dtype=bool)
    candidates = np.flatnonzero(worth)
    dense[candidates[np.argsort(-coverage[candidates], kind="stable")[:budget]]] = True
    return dense


def unifrac_sparse(counts: sp.csr_matrix, trees: TreeArrays, metric: str, out: np.ndarray,
                   progress: Callable[[int], None] | None = None) -> None:
    """Fill out [S, S] (float64 array or memmap) with all-pairs UniFrac; counts CSR [S, F] float64.

    progress(rows_done) is called after each row block."""
    counts = sp.csr_matrix(counts, dtype=np.float64)
    counts.sort_indices()
    if metric == "unweighted":
        _unweighted(counts, trees, out, progress)
    else:
        _weighted(counts, trees, out, progress)
    np.fill_diagonal(out, 0.0)


def _row_blocks(n: int, rows: int | None = None):
    # small enough for the block's accumulators to stay in cache, and >= 16 blocks so that the pairs of a
    # block with itself (computed twice) stay a small share
    step = rows or max(1, min(ROW_BLOCK_ELEMENTS // max(n, 1), -(-n // 16)))
    for lo in range(0, n, step):
        yield lo, min(n, lo + step)


def _store(out: np.ndarray, r0: int, c0: int, tile: np.ndarray) -> None:
    """tile = rows r0:, columns c0: (c0 >= r0) of the symmetric result; written to both triangles."""
    out[r0:r0 + tile.shape[0], c0:c0 + tile.shape[1]] = tile
    out[c0:c0 + tile.shape[1], r0:r0 + tile.shape[0]] = tile.T


def _node_abundances(counts: sp.csr_matrix, trees: TreeArrays) -> tuple[sp.csr_matrix, np.ndarray]:
    """CSR [rows, nodes]: each sample's count under each node; and coverage [nodes]: samples reaching each."""
    nodes = (counts @ trees.ancestors).tocsr()
    nodes.eliminate_zeros()
    return nodes, np.bincount(nodes.indices, minlength=trees.n_nodes)


def _unweighted(counts: sp.csr_matrix, trees: TreeArrays, out: np.ndarray, progress) -> None:
    """shared = sum over nodes both reach of b_n: dense nodes by BLAS, sparse nodes by a sparse product; tiles
    of UNWEIGHTED_TILE rows x columns, upper triangle only."""
    n, length = counts.shape[0], trees.length
    chunks = [(lo, min(n, lo + UNWEIGHTED_TILE)) for lo in range(0, n, UNWEIGHTED_TILE)]
    # node presence is built per chunk of samples (twice: to count coverage, then to split): the whole
    # [S, nodes] matrix is never held, only its sparse columns and the dense ones as bytes
    coverage = np.zeros(trees.n_nodes, dtype=np.int64)
    total = np.empty(n)  # [S] branch length each sample reaches
    for lo, hi in chunks:
        nodes = _node_abundances(counts[lo:hi], trees)[0]
        coverage += np.bincount(nodes.indices, minlength=trees.n_nodes)
        nodes.data[:] = 1.0
        total[lo:hi] = nodes @ length
    dense = _split_nodes(coverage, n, "unweighted", 1)
    dense_cols = np.flatnonzero(dense)
    dense_lengths = length[dense_cols]
    rank = np.cumsum(dense) - 1, np.cumsum(~dense) - 1  # a node's column among the dense / sparse ones
    dense_present = np.zeros((n, dense_cols.size), dtype=np.uint8)  # 0/1, exact, 8x smaller than float64
    sparse_indices, sparse_counts = [], []
    for lo, hi in chunks:
        nodes = _node_abundances(counts[lo:hi], trees)[0]
        rows = np.repeat(np.arange(lo, hi), np.diff(nodes.indptr))
        is_dense = dense[nodes.indices]
        dense_present[rows[is_dense], rank[0][nodes.indices[is_dense]]] = 1
        sparse_indices.append(rank[1][nodes.indices[~is_dense]].astype(np.int32))
        sparse_counts.append(np.bincount(rows[~is_dense] - lo, minlength=hi - lo))
    indices = np.concatenate(sparse_indices)
    indptr = np.concatenate([[0], np.cumsum(np.concatenate(sparse_counts))])
    del sparse_indices
    shape = (n, int((~dense).sum()))
    tile = UNWEIGHTED_TILE
    right_sparse = [sp.csr_matrix((np.ones(indptr[c1] - indptr[c0]), indices[indptr[c0]:indptr[c1]],
                                   indptr[c0:c1 + 1] - indptr[c0]), shape=(c1 - c0, shape[1])).T.tocsr()
                    for c0, c1 in chunks]
    weighted_sparse = sp.csr_matrix((length[~dense][indices], indices, indptr), shape=shape)
    for lo, hi in _row_blocks(n, tile):
        left = dense_present[lo:hi] * dense_lengths  # float64 [rows, dense nodes]
        for c0 in range(lo, n, tile):
            c1 = min(n, c0 + tile)
            shared = (weighted_sparse[lo:hi] @ right_sparse[c0 // tile]).toarray()
            if dense_cols.size:
                shared += left @ dense_present[c0:c1].T.astype(np.float64)
            union = total[lo:hi, None] + total[None, c0:c1] - shared
            with np.errstate(invalid="ignore", divide="ignore"):
                _store(out, lo, c0, np.where(union > 0, (union - shared) / union, 0.0))
        if progress:
            progress(hi)


def _weighted(counts: sp.csr_matrix, trees: TreeArrays, out: np.ndarray, progress) -> None:
    """num = sum_n b_n |p_in - p_jn|: dense nodes by a vectorised L1; a sparse node adds b_n (p_in + p_jn) for
    every pair minus 2 b_n min(p_in, p_jn) for the pairs that share it (enumerated)."""
    import torch

    n, length = counts.shape[0], trees.length
    totals = np.asarray(counts.sum(axis=1)).ravel()
    depth_sum = counts @ trees.depth  # [S] sum_t count_t depth_t
    safe = np.where(totals > 0, totals, 1.0)
    chunks = [(lo, min(n, lo + UNWEIGHTED_TILE)) for lo in range(0, n, UNWEIGHTED_TILE)]

    def scaled(lo: int, hi: int) -> sp.csr_matrix:
        """CSR [hi-lo, nodes] of b_n p_in; zero-length branches dropped (they add nothing)."""
        nodes = _node_abundances(counts[lo:hi], trees)[0]
        nodes.data *= length[nodes.indices] / np.repeat(safe[lo:hi], np.diff(nodes.indptr))
        nodes.eliminate_zeros()
        return nodes

    # built per chunk of samples, twice (coverage, then the split), as in _unweighted
    coverage = np.zeros(trees.n_nodes, dtype=np.int64)
    for lo, hi in chunks:
        coverage += np.bincount(scaled(lo, hi).indices, minlength=trees.n_nodes)
    dense = _split_nodes(coverage, n, "weighted", 8)
    rank = np.cumsum(dense) - 1, np.cumsum(~dense) - 1  # a node's column among the dense / sparse ones
    dense_vals = torch.zeros((n, int(dense.sum())), dtype=torch.float64)
    parts = []
    for lo, hi in chunks:
        part = scaled(lo, hi)
        rows = np.repeat(np.arange(lo, hi), np.diff(part.indptr))
        is_dense = dense[part.indices]
        dense_vals[rows[is_dense], rank[0][part.indices[is_dense]]] = torch.from_numpy(part.data[is_dense])
        parts.append(sp.csr_matrix((part.data[~is_dense], (rows[~is_dense] - lo,
                                                          rank[1][part.indices[~is_dense]])),
                                   shape=(hi - lo, int((~dense).sum()))))
    sparse_rows = sp.vstack(parts, format="csr") if parts else sp.csr_matrix((0, int((~dense).sum())))
    del parts
    sparse_rows.sort_indices()
    linear = np.asarray(sparse_rows.sum(axis=1)).ravel()  # sum over sparse nodes of b_n p_in
    by_node = sparse_rows.tocsc()
    by_node.sort_indices()
    first_at = by_node.indptr[:-1].copy()  # per sparse node: its first entry with sample >= lo
    normaliser = depth_sum / safe
    empty = totals == 0
    for lo, hi in _row_blocks(n):
        num = linear[lo:hi, None] + linear[None, lo:] - 2.0 * _shared_min(sparse_rows, by_node, first_at, lo, hi)
        if dense_vals.shape[1]:
            num += torch.cdist(dense_vals[lo:hi], dense_vals[lo:], p=1).numpy()
        den = normaliser[lo:hi, None] + normaliser[None, lo:]
        with np.errstate(invalid="ignore", divide="ignore"):
            block = np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)
        block[empty[lo:hi, None] & empty[None, lo:]] = 0.0
        _store(out, lo, lo, block)
        # the next blocks start at hi: skip each node's entries for samples lo..hi-1
        first_at += np.bincount(sparse_rows.indices[sparse_rows.indptr[lo]:sparse_rows.indptr[hi]],
                                minlength=first_at.size)
        if progress:
            progress(hi)


def _shared_min(rows: sp.csr_matrix, by_node: sp.csc_matrix, first_at: np.ndarray, lo: int, hi: int) -> np.ndarray:
    """[hi-lo, S-lo]: sum over the sparse nodes both samples reach of min(x_in, x_jn), for i in lo:hi, j >= lo.

    Every entry (i, node) of rows lo:hi pairs with the node's entries for samples j >= lo (a contiguous run of
    the column, from first_at[node]); pairs are enumerated in chunks and summed with one bincount each."""
    n = rows.shape[0]
    width = n - lo
    acc = np.zeros((hi - lo) * width)
    start, stop = rows.indptr[lo], rows.indptr[hi]
    left_node = rows.indices[start:stop]
    left_base = np.repeat(np.arange(hi - lo) * width - lo, np.diff(rows.indptr[lo:hi + 1]))  # flat row offset
    left_val = rows.data[start:stop]
    run_start = first_at[left_node]
    run_len = by_node.indptr[left_node + 1] - run_start
    ends = np.cumsum(run_len)
    k = 0
    while k < left_node.size:
        # as many left entries as fit in one chunk of pairs (at least one)
        base = ends[k - 1] if k else 0
        k2 = max(k + 1, int(np.searchsorted(ends, base + PAIRS_PER_CHUNK, side="right")))
        lens = run_len[k:k2]
        total = int(ends[k2 - 1] - base)
        if total:
            # partner entry = run_start + position within the run, built as one arange plus a per-run shift
            partner = np.arange(total) + np.repeat(run_start[k:k2] - (ends[k:k2] - lens - base), lens)
            vals = np.minimum(np.repeat(left_val[k:k2], lens), by_node.data[partner])
            flat = np.repeat(left_base[k:k2], lens) + by_node.indices[partner]
            acc += np.bincount(flat, weights=vals, minlength=acc.size)
        k = k2
    return acc.reshape(hi - lo, width)
