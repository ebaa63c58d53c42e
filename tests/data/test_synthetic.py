import numpy as np

from debug_nan.data.synthetic import synthesize
from debug_nan.data.unifrac import unifrac_matrix


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
