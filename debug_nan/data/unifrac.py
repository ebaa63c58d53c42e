"""UniFrac distances between all samples, computed once per table and cached outside the data folder.

Two backends compute the same numbers: scikit-bio's pairwise implementation (`skbio`), and a vectorised one
(`matrix`) that propagates counts up the tree with one sparse product and forms all pairs with one dense product.
`scripts/bench_data.py` measures both; `auto` takes the matrix backend above 200 samples, where it was measured
to be faster (see the README's performance table); below that, scikit-bio, the reference.
"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp

METRICS = ("unweighted", "weighted")
BACKENDS = ("auto", "skbio", "matrix")


def cache_dir() -> Path:
    """$DEBUG_NAN_CACHE_DIR, else $XDG_CACHE_HOME/debug-nan, else ~/.cache/debug-nan."""
    if os.environ.get("DEBUG_NAN_CACHE_DIR"):
        return Path(os.environ["DEBUG_NAN_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or (Path.home() / ".cache")
    return Path(base) / "debug-nan"


def cache_key(counts: sp.csr_matrix, asv_ids: list[str], sample_ids: list[str], tree, metric: str) -> str:
    h = hashlib.sha256()
    for arr in (counts.data, counts.indices, counts.indptr):
        h.update(np.ascontiguousarray(arr).tobytes())
    for part in ("\n".join(asv_ids), "\n".join(sample_ids), str(tree), metric, "v1"):
        h.update(part.encode())
    return h.hexdigest()[:32]


def unifrac_skbio(counts: sp.csr_matrix, asv_ids: list[str], tree, metric: str) -> np.ndarray:
    """[S, S] distances with scikit-bio."""
    from skbio.diversity import beta_diversity

    dense = np.rint(counts.toarray()).astype(np.int64)
    kwargs = {"normalized": True} if metric == "weighted" else {}
    dm = beta_diversity(f"{metric}_unifrac", dense, taxa=asv_ids, tree=tree, validate=False, **kwargs)
    return np.asarray(dm.data, dtype=np.float64)


def _tree_arrays(tree, asv_ids: list[str]) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    """Ancestor matrix [N, n_nodes] (tip -> every node on its path to the root, itself included),
    branch lengths [n_nodes] and root-to-tip depths [N], ASVs in asv_ids order."""
    nodes = list(tree.postorder(include_self=True))
    index = {id(n): k for k, n in enumerate(nodes)}
    lengths = np.array([(n.length or 0.0) if n is not tree else 0.0 for n in nodes])
    tip_pos = {name: i for i, name in enumerate(asv_ids)}
    rows, cols = [], []
    depths = np.zeros(len(asv_ids))
    for tip in tree.tips():
        if tip.name not in tip_pos:
            continue
        i = tip_pos[tip.name]
        node = tip
        while node is not None:
            rows.append(i)
            cols.append(index[id(node)])
            depths[i] += lengths[index[id(node)]]
            node = node.parent
    ancestors = sp.csr_matrix((np.ones(len(rows)), (rows, cols)), shape=(len(asv_ids), len(nodes)))
    return ancestors, lengths, depths


def unifrac_matrix(counts: sp.csr_matrix, asv_ids: list[str], tree, metric: str, progress: bool = False,
                   block_rows: int | None = None) -> np.ndarray:
    """[S, S] distances, vectorised: node abundances = counts @ ancestors, then all pairs in row blocks (a dense
    product for unweighted, a weighted L1 cdist for weighted), with a progress bar on a terminal."""
    from scipy.spatial.distance import cdist
    from tqdm import tqdm

    ancestors, lengths, depths = _tree_arrays(tree, asv_ids)
    node_counts = (counts @ ancestors).toarray()  # [S, n_nodes]
    n = node_counts.shape[0]
    dist = np.empty((n, n))
    block = block_rows or max(1, min(n, 20_000_000 // max(node_counts.shape[1], 1)))
    bar = tqdm(total=n, desc=f"UniFrac ({metric})", unit="sample", file=sys.stderr, leave=False,
               disable=not (progress and sys.stderr.isatty()))
    if metric == "unweighted":
        present = (node_counts > 0).astype(np.float64)
        total = present @ lengths  # branch length under each sample [S]
        weighted_present = present * lengths
        for lo in range(0, n, block):
            hi = min(n, lo + block)
            shared = weighted_present[lo:hi] @ present.T  # [rows, S]
            union = total[lo:hi, None] + total[None, :] - shared
            with np.errstate(invalid="ignore", divide="ignore"):
                dist[lo:hi] = np.where(union > 0, (union - shared) / union, 0.0)
            bar.update(hi - lo)
    else:
        totals = np.asarray(counts.sum(axis=1)).ravel()
        safe = np.where(totals > 0, totals, 1.0)
        keep = lengths > 0
        props = node_counts[:, keep] / safe[:, None]
        depth_sum = counts.multiply(1.0 / safe[:, None]).tocsr() @ depths  # [S]
        for lo in range(0, n, block):
            hi = min(n, lo + block)
            num = cdist(props[lo:hi], props, "minkowski", p=1, w=lengths[keep])
            denom = depth_sum[lo:hi, None] + depth_sum[None, :]
            with np.errstate(invalid="ignore", divide="ignore"):
                dist[lo:hi] = np.where(denom > 0, num / denom, 0.0)
            bar.update(hi - lo)
    bar.close()
    np.fill_diagonal(dist, 0.0)
    return dist


def compute_unifrac(counts: sp.csr_matrix, asv_ids: list[str], sample_ids: list[str], tree, metric: str,
                    backend: str = "auto", log=print) -> np.ndarray:
    """All-pairs UniFrac [S, S], from the cache when this exact table/tree/metric was seen before."""
    key = cache_key(counts, asv_ids, sample_ids, tree, metric)
    path = cache_dir() / "unifrac" / f"{key}.npy"
    if path.is_file():
        dist = np.load(path)
        log(f"UniFrac ({metric}) {dist.shape[0]}x{dist.shape[0]} read from cache {path}.")
        return dist
    integral = bool(np.all(counts.data == np.rint(counts.data)))
    if backend == "auto" or not integral:  # scikit-bio takes integer counts: relative abundances go by matrix
        backend = "matrix" if counts.shape[0] > 200 or not integral else "skbio"
    start = time.perf_counter()
    if backend == "matrix":
        dist = unifrac_matrix(counts, asv_ids, tree, metric, progress=True)
    else:
        log(f"Computing UniFrac ({metric}, scikit-bio) over {counts.shape[0]} samples...")
        dist = unifrac_skbio(counts, asv_ids, tree, metric)
    seconds = time.perf_counter() - start
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npy")
        np.save(tmp, dist)
        tmp.replace(path)
        where = f"cached in {path}"
    except OSError as exc:
        where = f"not cached ({exc})"
    log(f"UniFrac ({metric}, {backend}) over {counts.shape[0]} samples x {counts.shape[1]} ASVs took "
        f"{seconds:.2f} s; {where}.")
    return dist
