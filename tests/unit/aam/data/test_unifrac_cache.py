"""The UniFrac cache verifies itself: every broken entry is recomputed with a log line, never a traceback."""

import json

import numpy as np
import pytest

import debug_nan.aam.data.unifrac_cache as cache
from debug_nan.aam.data.unifrac import unifrac_targets


@pytest.fixture
def compute(tiny_data, tmp_path, monkeypatch):
    """compute() -> (UniFracTargets, log lines), on tiny_data with a fresh cache folder."""
    monkeypatch.setenv("DEBUG_NAN_CACHE_DIR", str(tmp_path / "cache"))

    def run(metric="unweighted"):
        said = []
        targets = unifrac_targets(tiny_data.counts, tiny_data.asv_ids, tiny_data.sample_ids, tiny_data.tree, metric,
                                  log=said.append, engine="builtin")
        return targets, said

    return run


def entry(tmp_path):
    [npy] = (tmp_path / "cache" / "unifrac").glob("*.npy")
    return npy, npy.with_suffix(".json")


def test_reused_and_outside_the_data(compute, tmp_path):
    first, said_first = compute()
    second, said = compute()
    np.testing.assert_array_equal(first.distances, second.distances)
    assert "took" in said_first[-1] and not first.from_cache
    assert second.from_cache and len(said) == 1 and "read from cache" in said[0] and "verified" in said[0]
    assert sorted(p.suffix for p in (tmp_path / "cache" / "unifrac").iterdir()) == [".json", ".npy"]


def _truncate(npy, meta):
    npy.write_bytes(npy.read_bytes()[:200])


def _wrong_shape(npy, meta):
    np.save(npy, np.zeros((3, 3)))


def _wrong_dtype(npy, meta):
    np.save(npy, np.load(npy).astype(np.float32))


def _garbage(npy, meta):
    npy.write_bytes(b"not a numpy file at all")


def _changed_value(npy, meta):
    dist = np.load(npy)
    dist[2, 5] += 1e-9
    np.save(npy, dist)


def _nan_turned_into_zero(npy, meta):
    dist = np.load(npy)
    data = json.loads(meta.read_text())
    dist[0, 1] = dist[1, 0] = np.nan  # the cache was written without NaN: a NaN now is a different pattern
    np.save(npy, dist)
    data["checksum"] = cache.scan(dist).checksum  # even with a matching checksum, the count disagrees
    meta.write_text(json.dumps(data))


def _metadata_missing(npy, meta):
    meta.unlink()


def _metadata_corrupt(npy, meta):
    meta.write_text('{"fingerprint": ')


def _other_tree(npy, meta):
    data = json.loads(meta.read_text())
    data["fingerprint"]["tree"] = "0" * 64
    meta.write_text(json.dumps(data))


BROKEN = {
    "truncated": (_truncate, "unreadable (ValueError"),
    "wrong shape": (_wrong_shape, "its shape is (3, 3), expected (24, 24)"),
    "wrong dtype": (_wrong_dtype, "its dtype is float32, expected float64"),
    "not a .npy": (_garbage, "unreadable ("),
    "a value changed": (_changed_value, "its values do not match the checksum written with it"),
    "non-finite pattern changed": (_nan_turned_into_zero, "it holds 1 non-finite pairs where 0 were computed"),
    "metadata missing": (_metadata_missing, "unreadable (FileNotFoundError"),
    "metadata corrupt": (_metadata_corrupt, "unreadable (JSONDecodeError"),
    "different inputs": (_other_tree, "it was computed from a different tree"),
}


@pytest.mark.parametrize("memmapped", [False, True])
@pytest.mark.parametrize("case", BROKEN)
def test_broken_entry_is_recomputed(case, memmapped, compute, tmp_path, monkeypatch):
    if memmapped:
        monkeypatch.setattr(cache, "MEMMAP_BYTES", 0)
    break_it, why = BROKEN[case]
    good, _ = compute()
    expected = np.array(good.distances)
    npy, meta = entry(tmp_path)
    del good
    break_it(npy, meta)
    again, said = compute()
    assert f"UniFrac cache file {npy} is invalid (" in said[0] and why in said[0] and said[0].endswith("; recomputing.")
    assert not again.from_cache and "cached in" in said[-1]
    np.testing.assert_array_equal(np.asarray(again.distances), expected)
    third, said = compute()  # the rewritten entry holds up
    assert third.from_cache and "read from cache" in said[0]
    assert sorted(p.name for p in npy.parent.iterdir()) == sorted([npy.name, meta.name])  # no temporary left


def test_large_results_are_memory_mapped_read_only(compute, tmp_path, monkeypatch):
    small, _ = compute("weighted")
    monkeypatch.setenv("DEBUG_NAN_CACHE_DIR", str(tmp_path / "other"))
    monkeypatch.setattr(cache, "MEMMAP_BYTES", 0)
    big, said = compute("weighted")
    assert isinstance(big.distances, np.memmap) and not big.distances.flags.writeable
    assert "memory-mapped in" in said[0]
    np.testing.assert_array_equal(np.asarray(big.distances), small.distances)
    reread, _ = compute("weighted")
    assert reread.from_cache and isinstance(reread.distances, np.memmap)


@pytest.mark.parametrize("memmapped", [False, True])
def test_unwritable_cache_still_gives_the_distances(memmapped, compute, tmp_path, monkeypatch):
    if memmapped:
        monkeypatch.setattr(cache, "MEMMAP_BYTES", 0)
    reference, _ = compute()
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("DEBUG_NAN_CACHE_DIR", str(blocker))  # a file where the folder should be
    targets, said = compute()
    assert "not cached (" in said[-1] and targets.cached_at is None
    np.testing.assert_array_equal(np.asarray(targets.distances), np.asarray(reference.distances))
