"""biocore's `unifrac` package (Striped UniFrac, the engine of QIIME 2 and AAM), used when it is importable.

It is not on PyPI as a wheel (its C++ library libssu comes from conda or Debian's `python3-unifrac`), so the
built-in engine is the fallback everywhere else. Its functions take a BIOM 2.1 file and a Newick file: the
table and tree are written to a temporary folder first, and the result is reordered to the caller's samples.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import scipy.sparse as sp


def striped_version() -> str | None:
    """The installed unifrac package's version, or None when it cannot be imported."""
    try:
        import unifrac
    except Exception:  # noqa: BLE001 - an installed package whose C library is missing raises ImportError/OSError
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("unifrac")
    except PackageNotFoundError:
        return getattr(unifrac, "__version__", "unknown")


def _function(metric: str):
    import unifrac

    name = "unweighted" if metric == "unweighted" else "weighted_normalized"
    return getattr(unifrac, f"{name}_fp64", None) or getattr(unifrac, name)  # fp64 where the version has it


def unifrac_striped(counts: sp.csr_matrix, feature_ids: list[str], sample_ids: list[str], tree,
                    metric: str) -> np.ndarray:
    """[S, S] float64 UniFrac by Striped UniFrac, rows/columns in sample_ids order; counts CSR [S, F]."""
    import biom
    import h5py

    table = biom.Table(sp.csr_matrix(counts).T.tocsr(), observation_ids=feature_ids, sample_ids=sample_ids)
    with tempfile.TemporaryDirectory(prefix="debug-nan-unifrac-") as folder:
        table_path, tree_path = Path(folder) / "table.biom", Path(folder) / "tree.nwk"
        with h5py.File(table_path, "w") as handle:
            table.to_hdf5(handle, "debug-nan")
        tree.write(str(tree_path), format="newick")
        result = _function(metric)(str(table_path), str(tree_path))
    ids = list(result.ids)
    if sorted(ids) != sorted(sample_ids):
        missing = sorted(set(sample_ids) - set(ids))
        raise ValueError(f"it returned {len(ids)} samples of {len(sample_ids)}"
                         + (f" (missing e.g. {', '.join(missing[:3])})" if missing else ""))
    position = {sample: k for k, sample in enumerate(ids)}
    order = [position[s] for s in sample_ids] if ids != list(sample_ids) else None
    data = np.asarray(result.data, dtype=np.float64)
    return data[np.ix_(order, order)] if order is not None else data
