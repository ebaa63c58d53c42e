import numpy as np

from debug_nan.aam.data.synthetic import synthesize
from debug_nan.aam.data.unifrac import unifrac_matrix


def test_deterministic_under_seed():
    a, b, c = synthesize(12, 16, seed=5), synthesize(12, 16, seed=5), synthesize(12, 16, seed=6)
    assert a.asv_ids == b.asv_ids and (a.counts != b.counts).nnz == 0
    assert a.asv_ids != c.asv_ids


def test_tree_tips_are_the_table_ids_and_richness_straddles_the_limit():
    data = synthesize(30, 32, seed=1)
    assert sorted(t.name for t in data.tree.tips()) == sorted(data.asv_ids)
    assert len(set(data.asv_ids)) == len(data.asv_ids)
    richness = data.richness()
    assert richness.min() <= 32 // 4 and richness.max() >= 48  # padding slots and truncation both happen
    assert set("".join(data.asv_ids)) <= set("ACGT")


def test_sequences_evolved_along_the_tree():
    data = synthesize(10, 32, seed=2)
    seq = {t.name: t.name for t in data.tree.tips()}

    def mismatches(a, b):
        n = min(len(a), len(b))
        return sum(x != y for x, y in zip(a[:n], b[:n])) / n

    sisters = [mismatches(*[c.name for c in node.children]) for node in data.tree.non_tips()
               if all(c.is_tip() for c in node.children)]
    rng = np.random.default_rng(0)
    ids = list(seq)
    random_pairs = [mismatches(ids[i], ids[j]) for i, j in rng.integers(0, len(ids), size=(200, 2)) if i != j]
    assert np.mean(sisters) < 0.5 * np.mean(random_pairs)


def test_unifrac_is_meaningful():
    data = synthesize(24, 32, seed=4)
    dist = unifrac_matrix(data.counts, data.asv_ids, data.tree, "unweighted")
    off = dist[~np.eye(24, dtype=bool)]
    assert np.isfinite(dist).all() and 0.05 < off.min() and off.max() <= 1.0
    assert off.std() > 0.05  # samples from the same region of the tree are closer than others


def test_same_data_as_before_under_the_same_seed():
    """The synthetic table is part of every test's expectations: a faster implementation must not change it."""
    import hashlib

    data = synthesize(24, 24, seed=3)
    digest = hashlib.sha256("\n".join(data.asv_ids).encode() + data.counts.toarray().tobytes()).hexdigest()[:16]
    assert (data.counts.nnz, int(data.counts.sum()), data.asv_ids[0][:12]) == (601, 9365, "AGGTTTAGTACC")
    assert digest == "e74db789dc3286bc"  # as computed by the implementation before the speed-ups


def test_size_is_estimated_and_said_before_the_work():
    from debug_nan.aam.data.synthetic import estimate_synthetic_bytes

    lines = []
    synthesize(8, 16, seed=0, log=lines.append)
    assert lines[0].startswith("Synthesizing 8 samples x 64 ASVs (token limit 16, about ") and lines[0].endswith(" ...")
    assert lines[1].startswith("Synthesized 8 samples x 64 ASVs (") and lines[1].endswith(" s.")
    # measured peak of synthesize(48, 100_000): ~0.7 GB above the interpreter (see BYTES_PER_ASV)
    assert 0.6 * 2**30 < estimate_synthetic_bytes(48, 100_000) < 1.0 * 2**30
    assert estimate_synthetic_bytes(48, 200_000) > 1.9 * estimate_synthetic_bytes(48, 100_000)


def test_a_synthetic_table_that_cannot_fit_stops_before_the_work():
    import pytest

    from debug_nan.aam.data.synthetic import check_synthetic_fits
    from debug_nan.errors import InputError

    assert check_synthetic_fits(48, 512, available=2**30) < 2**30
    assert check_synthetic_fits(48, 10**9, available=None) > 2**40  # unknown memory: no verdict
    with pytest.raises(InputError, match=r"--token-limit 100000 would need about 750.7 MB of memory \(48 samples x "
                                         r"300,000 ASVs.*only 100.0 MB is available. Lower --token-limit"):
        check_synthetic_fits(48, 100_000, available=100 * 2**20)
