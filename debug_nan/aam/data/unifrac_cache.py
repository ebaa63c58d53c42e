"""The UniFrac cache: one verified [S, S] float64 .npy per table/tree/metric/engine, outside the data folder.

Each entry is KEY.npy (the matrix) and KEY.json (what it was computed from and what it holds: the inputs'
fingerprint, shape, dtype, the number and first pairs of non-finite values, and a checksum of every value).
Both are written to temporary names and renamed, the .json last, so a reader never sees a half-written entry.
Reading verifies all of it; any failure is a reason string, and the caller recomputes.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

FORMAT = 2
MEMMAP_BYTES = 256 * 2**20  # results larger than this live in a memory-mapped file, not in RAM
VERIFY_ROWS = 1024  # rows per chunk when scanning a matrix
MAX_LISTED = 1000  # non-finite pairs kept by name


def cache_dir() -> Path:
    """$DEBUG_NAN_CACHE_DIR, else $XDG_CACHE_HOME/debug-nan, else ~/.cache/debug-nan."""
    if os.environ.get("DEBUG_NAN_CACHE_DIR"):
        return Path(os.environ["DEBUG_NAN_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or (Path.home() / ".cache")
    return Path(base) / "debug-nan"


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        if isinstance(part, np.ndarray):
            h.update(str(part.dtype).encode())
            h.update(np.ascontiguousarray(part).tobytes())
        else:
            h.update(str(part).encode())
        h.update(b"\0")
    return h.hexdigest()


def fingerprint(counts, feature_ids: list[str], sample_ids: list[str], trees, metric: str, engine: str) -> dict:
    """What a cached matrix was computed from: one digest per input, plus metric and engine."""
    return {
        "format": FORMAT,
        "counts": _digest(counts.data, counts.indices, counts.indptr, *counts.shape),
        "sample_ids": _digest("\n".join(sample_ids)),
        "feature_ids": _digest("\n".join(feature_ids)),
        "tree": _digest(trees.parent, trees.length, trees.ancestors.indices, trees.ancestors.indptr),
        "metric": metric,
        "engine": engine,
    }


@dataclass
class Scan:
    """One pass over a matrix: a checksum of every value, and where the non-finite values are (i < j)."""

    checksum: str
    n_nonfinite: int
    pairs: list[tuple[int, int]] = field(default_factory=list)


def scan(dist: np.ndarray) -> Scan:
    """Checksum + non-finite pairs (upper triangle), in row chunks so a memmap is never all in memory."""
    h = hashlib.sha256()
    pairs: list[tuple[int, int]] = []
    count = 0
    n = dist.shape[0]
    for lo in range(0, n, VERIFY_ROWS):
        block = np.asarray(dist[lo:lo + VERIFY_ROWS])
        h.update(block.tobytes())
        rows, cols = np.nonzero(~np.isfinite(block))
        upper = cols > rows + lo
        count += int(upper.sum())
        if len(pairs) < MAX_LISTED:
            pairs += [(int(r) + lo, int(c)) for r, c in zip(rows[upper], cols[upper])][:MAX_LISTED - len(pairs)]
    return Scan(h.hexdigest(), count, pairs)


def entry_paths(key: str) -> tuple[Path, Path]:
    folder = cache_dir() / "unifrac"
    return folder / f"{key}.npy", folder / f"{key}.json"


def cache_key(fp: dict) -> str:
    return _digest(json.dumps(fp, sort_keys=True))[:32]


def read_entry(fp: dict, n_samples: int) -> tuple[np.ndarray, Scan] | str:
    """The cached matrix (a read-only memmap when large) and its scan, or why the entry cannot be used."""
    path, meta_path = entry_paths(cache_key(fp))
    if not path.exists() and not meta_path.exists():
        return "absent"
    try:
        meta = json.loads(meta_path.read_text())
        if not isinstance(meta, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as exc:
        return f"its metadata {meta_path.name} is unreadable ({type(exc).__name__}: {exc})"
    for name, value in fp.items():
        if meta.get("fingerprint", {}).get(name) != value:
            return f"it was computed from a different {name.replace('_', ' ')}"
    try:
        big = path.stat().st_size > MEMMAP_BYTES
        dist = np.load(path, mmap_mode="r" if big else None, allow_pickle=False)
    except (OSError, ValueError, EOFError) as exc:
        return f"unreadable ({type(exc).__name__}: {exc})"
    if dist.shape != (n_samples, n_samples):
        return f"its shape is {dist.shape}, expected ({n_samples}, {n_samples})"
    if dist.dtype != np.float64:
        return f"its dtype is {dist.dtype}, expected float64"
    try:
        found = scan(dist)
    except (OSError, ValueError) as exc:
        return f"unreadable ({type(exc).__name__}: {exc})"
    if found.checksum != meta.get("checksum"):
        return "its values do not match the checksum written with it"
    if found.n_nonfinite != meta.get("n_nonfinite"):
        return (f"it holds {found.n_nonfinite} non-finite pairs where {meta.get('n_nonfinite')} were computed")
    return dist, found


def new_matrix(fp: dict, n_samples: int) -> tuple[np.ndarray, Path | None]:
    """An [S, S] float64 array to compute into: in memory, or above MEMMAP_BYTES a memmap under a temporary
    name in the cache folder (None when small). Raises OSError when a large one cannot be created there."""
    if n_samples * n_samples * 8 <= MEMMAP_BYTES:
        return np.empty((n_samples, n_samples)), None
    path, _ = entry_paths(cache_key(fp))
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")
    return np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float64, shape=(n_samples, n_samples)), tmp


def write_entry(fp: dict, dist: np.ndarray, found: Scan, tmp: Path | None) -> Path:
    """Commit a computed matrix: the .npy (renamed from tmp, or saved), then its .json. Raises OSError."""
    path, meta_path = entry_paths(cache_key(fp))
    path.parent.mkdir(parents=True, exist_ok=True)
    meta_path.unlink(missing_ok=True)  # an entry without its .json is never read: safe while we replace it
    if tmp is None:
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npy")
        try:
            np.save(tmp, dist)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    else:
        dist.flush()
    os.replace(tmp, path)
    meta = {"fingerprint": fp, "shape": list(dist.shape), "dtype": "float64", "checksum": found.checksum,
            "n_nonfinite": found.n_nonfinite, "nonfinite_pairs": found.pairs}
    meta_tmp = meta_path.with_name(f"{meta_path.stem}.{os.getpid()}.tmp.json")
    meta_tmp.write_text(json.dumps(meta))
    os.replace(meta_tmp, meta_path)
    return path
