"""UniFrac distances between all samples, computed once per table/tree/metric and cached outside the data folder.

Engines: biocore's `unifrac` (Striped UniFrac, what QIIME 2 and AAM use) when it is importable, else the built-in
sparse engine (unifrac_sparse.py), which gives scikit-bio's numbers at every size. The log names the engine.
Non-finite distances stay in the matrix (never turned into 0) and are listed by sample pair, so the caller
can report them. The cache verifies itself (unifrac_cache.py) and is recomputed when it does not hold up.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from debug_nan.aam.data import unifrac_cache as cache
from debug_nan.aam.data.unifrac_cache import cache_dir  # noqa: F401  (re-exported: where the cache lives)
from debug_nan.aam.data.unifrac_sparse import tree_arrays, unifrac_sparse
from debug_nan.aam.data.unifrac_striped import striped_version, unifrac_striped
from debug_nan.errors import InputError

METRICS = ("unweighted", "weighted")
ENGINES = ("auto", "striped", "builtin")
BUILTIN = "the built-in sparse engine"
PROGRESS_EVERY_S = 30.0


@dataclass
class UniFracTargets:
    """distances: float64 [S, S] in sample_ids order, NaN/Inf kept (a read-only memmap when larger than
    unifrac_cache.MEMMAP_BYTES); nonfinite_pairs: the first unifrac_cache.MAX_LISTED sample-ID pairs (i < j)
    whose distance is NaN or Inf, n_nonfinite_pairs all of them; engine: what computed the numbers;
    cached_at: the cache file, or None when it could not be written."""

    distances: np.ndarray
    sample_ids: list[str]
    metric: str
    engine: str
    nonfinite_pairs: list[tuple[str, str]]
    n_nonfinite_pairs: int
    from_cache: bool
    cached_at: Path | None


def _size(nbytes: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if nbytes < 1024 or unit == "GiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.1f} {unit}"
        nbytes /= 1024
    return ""


def _notices(counts: sp.csr_matrix, trees, metric: str, log) -> None:
    if trees.root_children > 2:
        log(f"NOTICE: the tree's root has {trees.root_children} children (an unrooted tree, as FastTree writes): "
            f"UniFrac takes that top node as the root, as scikit-bio and Striped UniFrac do; QIIME 2 roots such "
            f"trees first (`qiime phylogeny midpoint-root`), which changes the distances.")
    empty = int((np.diff(counts.indptr) == 0).sum()) if counts.nnz else counts.shape[0]
    if empty:
        log(f"NOTICE: {empty} samples have no reads: their UniFrac ({metric}) is 0 to each other and usually 1 "
            f"to a sample with reads (scikit-bio's convention).")


def _choose_engine(engine: str) -> tuple[str, str | None]:
    """(engine name for the log and the fingerprint, Striped version or None)."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, not {engine!r}")
    version = striped_version() if engine != "builtin" else None
    if engine == "striped" and version is None:
        raise InputError("UniFrac engine 'striped' was asked for, but the `unifrac` package cannot be imported "
                         "(install it from conda: `conda install -c bioconda unifrac`, or Debian's python3-unifrac).")
    if version is not None:
        return f"unifrac {version} (Striped UniFrac)", version
    return BUILTIN, None


def unifrac_targets(counts: sp.csr_matrix, feature_ids: list[str], sample_ids: list[str], tree, metric: str,
                    log=print, engine: str = "auto") -> UniFracTargets:
    """All-pairs UniFrac [S, S] for counts CSR [S, F] (features in feature_ids order, on the tips of the
    skbio.TreeNode `tree`); metric "unweighted" or "weighted" (normalized). Read from the cache when a verified
    entry exists, else computed (Striped UniFrac when importable, unless engine="builtin") and cached."""
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, not {metric!r}")
    counts = sp.csr_matrix(counts, dtype=np.float64)
    counts.sort_indices()
    n = counts.shape[0]
    try:
        trees = tree_arrays(tree, list(feature_ids))
    except KeyError as exc:
        raise InputError(f"UniFrac cannot be computed: {exc.args[0]}.") from None
    name, version = _choose_engine(engine)
    fp = cache.fingerprint(counts, list(feature_ids), list(sample_ids), trees, metric, name)
    found = cache.read_entry(fp, n)
    path, _ = cache.entry_paths(cache.cache_key(fp))
    if isinstance(found, tuple):
        dist, scanned = found
        log(f"UniFrac ({metric}) {n}x{n} read from cache {path} (verified; computed by {name}).")
        return _targets(dist, sample_ids, metric, name, scanned, True, path, log)
    if found != "absent":
        log(f"UniFrac cache file {path} is invalid ({found}); recomputing.")
    _notices(counts, trees, metric, log)
    start = time.perf_counter()
    dist = None
    if version is not None:
        log(f"Computing UniFrac ({metric}) with {name}: {n:,} samples x {counts.shape[1]:,} features...")
        try:
            dist = unifrac_striped(counts, list(feature_ids), list(sample_ids), tree, metric)
        except Exception as exc:  # noqa: BLE001 - a third-party C++ engine: any failure falls back to the built-in one
            if engine == "striped":
                raise InputError(f"Striped UniFrac failed ({type(exc).__name__}: {exc}).") from None
            log(f"Striped UniFrac failed ({type(exc).__name__}: {exc}); using {BUILTIN} instead.")
            name = BUILTIN
            fp = cache.fingerprint(counts, list(feature_ids), list(sample_ids), trees, metric, name)
    tmp = None
    if dist is None:
        dist, tmp = _builtin(counts, trees, metric, fp, log)
    try:
        scanned = cache.scan(dist)
        seconds = time.perf_counter() - start
        try:
            path = cache.write_entry(fp, dist, scanned, tmp)
            where = f"cached in {path}"
            if tmp is not None:  # reopen read-only: the caller must not be able to change the cached numbers
                dist = np.load(path, mmap_mode="r")
        except OSError as exc:
            path, where = None, f"not cached ({exc})"
    finally:  # a memmap's temporary file never outlives this call (the mapping stays valid once unlinked)
        if tmp is not None:
            tmp.unlink(missing_ok=True)
    log(f"UniFrac ({metric}, {name}) over {n:,} samples x {counts.shape[1]:,} features took {seconds:.1f} s; "
        f"{where}.")
    return _targets(dist, sample_ids, metric, name, scanned, False, path, log)


def _builtin(counts: sp.csr_matrix, trees, metric: str, fp: dict, log) -> tuple[np.ndarray, Path | None]:
    """Compute with the built-in engine into memory, or into a memmap when the result is large."""
    n = counts.shape[0]
    try:
        dist, tmp = cache.new_matrix(fp, n)
    except OSError as exc:  # no cache folder: map a temporary file instead, removed once mapped
        log(f"UniFrac cache folder {cache.cache_dir()} is not writable ({exc}); computing into a temporary file.")
        handle = tempfile.NamedTemporaryFile(prefix="debug-nan-unifrac-", suffix=".npy", delete=False)
        handle.close()
        dist = np.lib.format.open_memmap(handle.name, mode="w+", dtype=np.float64, shape=(n, n))
        Path(handle.name).unlink()
        tmp = None
    where = f", memory-mapped in {tmp}" if tmp is not None else ""
    log(f"Computing UniFrac ({metric}) with {BUILTIN} (scikit-bio's conventions): {n:,} samples x "
        f"{counts.shape[1]:,} features ({counts.nnz:,} non-zeros), tree of {trees.n_nodes:,} nodes; result "
        f"{n:,}x{n:,} float64 ({_size(8.0 * n * n)}{where})...")
    start = last = time.perf_counter()
    total_pairs = n * (n + 1) / 2

    def progress(rows_done: int) -> None:
        nonlocal last
        now = time.perf_counter()
        if now - last >= PROGRESS_EVERY_S and rows_done < n:
            last = now
            share = (rows_done * n - rows_done * (rows_done - 1) / 2) / total_pairs
            log(f"  UniFrac ({metric}): {rows_done:,} of {n:,} rows, {100 * share:.0f}% of the pairs, "
                f"{now - start:.0f} s elapsed, about {(now - start) * (1 - share) / share:.0f} s left")

    try:
        unifrac_sparse(counts, trees, metric, dist, progress)
    except BaseException:  # Ctrl-C or an error: leave no half-computed file behind
        if tmp is not None:
            del dist
            tmp.unlink(missing_ok=True)
        raise
    return dist, tmp


def _targets(dist, sample_ids, metric, name, scanned, from_cache, path, log) -> UniFracTargets:
    pairs = [(sample_ids[i], sample_ids[j]) for i, j in scanned.pairs]
    if scanned.n_nonfinite:
        shown = ", ".join(f"{a}/{b} = {dist[i, j]}" for (a, b), (i, j) in zip(pairs[:3], scanned.pairs))
        log(f"WARNING: {scanned.n_nonfinite} UniFrac ({metric}) distances are not finite (kept as they are, never "
            f"replaced by 0), e.g. {shown}.")
    return UniFracTargets(dist, list(sample_ids), metric, name, pairs, scanned.n_nonfinite, from_cache, path)


def compute_unifrac(counts: sp.csr_matrix, asv_ids: list[str], sample_ids: list[str], tree, metric: str,
                    log=print, engine: str = "auto") -> np.ndarray:
    """The distances of unifrac_targets(...) (float64 [S, S], non-finite values kept and logged)."""
    return unifrac_targets(counts, asv_ids, sample_ids, tree, metric, log=log, engine=engine).distances


def unifrac_matrix(counts: sp.csr_matrix, feature_ids: list[str], tree, metric: str) -> np.ndarray:
    """[S, S] float64 by the built-in engine, in memory, no cache, no log (for small tables and checks)."""
    counts = sp.csr_matrix(counts, dtype=np.float64)
    dist = np.empty((counts.shape[0], counts.shape[0]))
    unifrac_sparse(counts, tree_arrays(tree, list(feature_ids)), metric, dist)
    return dist


def unifrac_skbio(counts: sp.csr_matrix, feature_ids: list[str], tree, metric: str) -> np.ndarray:
    """[S, S] by scikit-bio, the reference the built-in engine is tested against: integer counts only
    (scikit-bio 0.7 truncates fractional counts to integers), O(S^2 x nodes) pairs in Python."""
    from skbio.diversity import beta_diversity

    kwargs = {"normalized": True} if metric == "weighted" else {}
    dense = sp.csr_matrix(counts).toarray()
    dm = beta_diversity(f"{metric}_unifrac", dense, taxa=list(feature_ids), tree=tree, validate=False, **kwargs)
    return np.asarray(dm.data, dtype=np.float64)
