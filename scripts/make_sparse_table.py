"""A large, realistic, sparse feature table and a random tree over its features, for UniFrac at scale.

    python scripts/make_sparse_table.py --samples 20000 --features 100000 --out big/   # big/table.biom + tree.nwk

Realistic means what 16S tables look like: each sample holds 50-500 features (--min/--max-richness), feature
prevalence is heavy-tailed (a few features are in many samples, most in few: log-normal popularity), samples come
from a handful of environments that favour different clades (a window of tips in tree order), and read counts
per feature are log-normal. The tree is a random rooted binary tree (random joining, exponential branch lengths)
whose tips are exactly the features. Deterministic under --seed. `make_sparse_table()` is also imported by
scripts/bench_unifrac.py to build tables in memory.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp


def random_parents(n_tips: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A random rooted binary tree as arrays: parent [2n-1] (-1 at the root, the last node) and branch length
    [2n-1] (0 at the root); nodes 0..n-1 are the tips. Random joining with O(1) removal from the pool."""
    n_nodes = 2 * n_tips - 1
    parent = np.full(n_nodes, -1, dtype=np.int64)
    pool = list(range(n_tips))
    for new in range(n_tips, n_nodes):
        for _ in range(2):
            k = int(rng.integers(len(pool)))
            pool[k], pool[-1] = pool[-1], pool[k]
            parent[pool.pop()] = new
        pool.append(new)
    length = rng.exponential(0.05, size=n_nodes)
    length[-1] = 0.0
    return parent, length


def to_treenode(parent: np.ndarray, length: np.ndarray, tip_names: list[str]):
    """skbio.TreeNode from parent/length arrays (children before parents, root last)."""
    from skbio import TreeNode

    n_tips = len(tip_names)
    nodes = [TreeNode(name=tip_names[i] if i < n_tips else None, length=float(length[i]))
             for i in range(parent.size)]
    children: list[list] = [[] for _ in range(parent.size)]
    for child, par in enumerate(parent[:-1]):
        children[par].append(nodes[child])
    for i in range(n_tips, parent.size):
        nodes[i].extend(children[i], uncache=False)
    root = nodes[-1]
    root.length = None
    return root


def tip_order(parent: np.ndarray, n_tips: int) -> np.ndarray:
    """Tips in depth-first order (so a window of this order is a set of neighbouring clades)."""
    children: list[list[int]] = [[] for _ in range(parent.size)]
    for child, par in enumerate(parent[:-1]):
        children[par].append(child)
    order, stack = [], [parent.size - 1]
    while stack:
        node = stack.pop()
        if node < n_tips:
            order.append(node)
        else:
            stack.extend(children[node])
    return np.array(order)


def make_sparse_table(n_samples: int, n_features: int, min_richness: int = 50, max_richness: int = 500,
                      n_environments: int = 8, seed: int = 0):
    """(counts CSR [S, F] float64, feature IDs [F], sample IDs [S], skbio.TreeNode over the features)."""
    rng = np.random.default_rng(seed)
    parent, length = random_parents(n_features, rng)
    feature_ids = [f"F{i}" for i in range(n_features)]
    order = tip_order(parent, n_features)
    popularity = rng.lognormal(0.0, 1.5, size=n_features)
    cdfs = []
    for _ in range(n_environments):  # each environment favours a quarter of the tree (neighbouring clades)
        favoured = np.roll(order, int(rng.integers(n_features)))[: n_features // 4]
        weight = popularity.copy()
        weight[favoured] *= 20.0
        cdfs.append(np.cumsum(weight) / weight.sum())
    richness = rng.integers(min_richness, max_richness + 1, size=n_samples)
    environment = rng.integers(n_environments, size=n_samples)
    indptr, indices = [0], []
    for s in range(n_samples):
        draws = np.searchsorted(cdfs[environment[s]], rng.random(int(richness[s] * 1.5) + 8))
        chosen = np.unique(np.minimum(draws, n_features - 1))
        if chosen.size > richness[s]:
            chosen = np.sort(rng.choice(chosen, size=richness[s], replace=False))
        indices.append(chosen)
        indptr.append(indptr[-1] + chosen.size)
    indices_all = np.concatenate(indices)
    values = np.ceil(rng.lognormal(2.0, 1.5, size=indices_all.size))
    counts = sp.csr_matrix((values, indices_all, np.array(indptr)), shape=(n_samples, n_features))
    sample_ids = [f"S{i}" for i in range(n_samples)]
    return counts, feature_ids, sample_ids, to_treenode(parent, length, feature_ids)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=20_000)
    ap.add_argument("--features", type=int, default=100_000)
    ap.add_argument("--min-richness", type=int, default=50)
    ap.add_argument("--max-richness", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True, help="folder to write table.biom (HDF5) and tree.nwk into")
    args = ap.parse_args()
    import biom

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    print(f"Generating {args.samples:,} samples x {args.features:,} features...", flush=True)
    counts, feature_ids, sample_ids, tree = make_sparse_table(args.samples, args.features, args.min_richness,
                                                              args.max_richness, seed=args.seed)
    table = biom.Table(counts.T.tocsr(), observation_ids=feature_ids, sample_ids=sample_ids)
    for path, write in ((out / "table.biom", lambda p: _write_biom(table, p)),
                        (out / "tree.nwk", lambda p: tree.write(str(p), format="newick"))):
        tmp = path.with_name(path.name + ".tmp")
        write(tmp)
        tmp.replace(path)
    print(f"Wrote {out / 'table.biom'} ({counts.nnz:,} non-zeros, {counts.nnz / args.samples:.0f} features per "
          f"sample) and {out / 'tree.nwk'} in {time.perf_counter() - start:.1f} s.", file=sys.stdout)


def _write_biom(table, path: Path) -> None:
    import h5py

    with h5py.File(path, "w") as handle:
        table.to_hdf5(handle, "debug-nan make_sparse_table")


if __name__ == "__main__":
    main()
