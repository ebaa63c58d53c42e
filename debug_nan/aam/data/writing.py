"""Write a Dataset as BIOM (HDF5 or JSON) + Newick: the demo data, test fixtures, and users' synthetic exports."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from debug_nan.aam.data.loading import Dataset


def to_biom_table(data: Dataset):
    import biom

    return biom.Table(np.asarray(data.counts.T.todense()), observation_ids=list(data.asv_ids),
                      sample_ids=list(data.sample_ids))


def write_biom(data: Dataset, path: str | Path, fmt: str = "hdf5") -> Path:
    """fmt 'hdf5' (BIOM 2.1) or 'json' (BIOM 1.0)."""
    path = Path(path)
    table = to_biom_table(data)
    if fmt == "json":
        path.write_text(table.to_json("debug-nan"))
    else:
        import h5py

        with h5py.File(path, "w") as handle:
            table.to_hdf5(handle, "debug-nan")
    return path


def write_tree(data: Dataset, path: str | Path) -> Path:
    path = Path(path)
    data.tree.write(str(path), format="newick")
    return path
