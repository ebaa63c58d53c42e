"""The built-in UniFrac engine against scikit-bio, on the trees and tables where conventions differ."""

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from skbio import TreeNode
from skbio.diversity import beta_diversity

import debug_nan.aam.data.unifrac_sparse as engine
from debug_nan.aam.data.batches import Collator
from debug_nan.aam.data.unifrac import compute_unifrac, unifrac_matrix, unifrac_targets
from debug_nan.errors import InputError


def random_tree(rng, n_tips, root_length=0.7, polytomies=False, zero_lengths=False, unrooted=False):
    """Random tree over tips f0..f{n-1}; optional multifurcations, zero-length branches, a 3-child root."""
    nodes = [TreeNode(name=f"f{i}", length=float(rng.exponential(0.3))) for i in range(n_tips)]
    while len(nodes) > (3 if unrooted else 1):
        k = min(len(nodes), int(rng.integers(2, 5)) if polytomies else 2)
        kids = [nodes.pop(i) for i in sorted(rng.choice(len(nodes), k, replace=False), reverse=True)]
        zero = zero_lengths and rng.random() < 0.3
        nodes.append(TreeNode(children=kids, length=0.0 if zero else float(rng.exponential(0.3))))
    root = nodes[0] if len(nodes) == 1 else TreeNode(children=nodes)
    root.length = root_length
    for tip in root.tips() if zero_lengths else []:
        if rng.random() < 0.2:
            tip.length = 0.0
    return root


def random_counts(rng, n_samples, n_tips, empty=(0,)):
    counts = (rng.random((n_samples, n_tips)) < 0.3) * rng.integers(1, 60, (n_samples, n_tips))
    counts[list(empty)] = 0
    return counts.astype(float)


def skbio_distances(counts, ids, tree, metric):
    kwargs = {"normalized": True} if metric == "weighted" else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 0/0 -> NaN is part of what is compared
        return beta_diversity(f"{metric}_unifrac", counts, taxa=ids, tree=tree, validate=False, **kwargs).data


def assert_same(ours, ref):
    assert (np.isnan(ours) == np.isnan(ref)).all()
    np.testing.assert_allclose(np.nan_to_num(ours, nan=-1), np.nan_to_num(ref, nan=-1), rtol=0, atol=1e-12)


TREES = {
    "root length": dict(root_length=0.7),
    "no root length": dict(root_length=None),
    "polytomies": dict(polytomies=True),
    "unrooted (3-child root)": dict(unrooted=True, root_length=None),
    "zero-length branches": dict(zero_lengths=True, root_length=0.0),
}


@pytest.mark.parametrize("metric", ["unweighted", "weighted"])
@pytest.mark.parametrize("kind", TREES)
def test_equals_skbio(kind, metric):
    rng = np.random.default_rng(abs(hash(kind)) % 1000)
    for _ in range(3):
        n_tips, n_samples = int(rng.integers(4, 30)), int(rng.integers(3, 20))
        tree = random_tree(rng, n_tips, **TREES[kind])
        ids = [f"f{i}" for i in range(n_tips)]
        counts = random_counts(rng, n_samples, n_tips, empty=(0, n_samples - 1))  # two samples without reads
        assert_same(unifrac_matrix(sp.csr_matrix(counts), ids, tree, metric),
                    skbio_distances(counts, ids, tree, metric))


@pytest.mark.parametrize("metric", ["unweighted", "weighted"])
def test_fractional_counts(metric):
    """Relative abundances: scikit-bio truncates fractional counts, so the reference is each sample scaled to
    integers (weighted UniFrac uses proportions, unweighted presence: both are scale-free per sample)."""
    rng = np.random.default_rng(5)
    tree = random_tree(rng, 20, polytomies=True)
    ids = [f"f{i}" for i in range(20)]
    integers = random_counts(rng, 12, 20, empty=(3,))
    scale = rng.integers(1, 9, size=(12, 1)) * 8.0
    fractions = integers / scale
    ours = unifrac_matrix(sp.csr_matrix(fractions), ids, tree, metric)
    assert_same(ours, skbio_distances(integers, ids, tree, metric))
    assert ((0 < fractions) & (fractions < 1)).any()


@pytest.mark.parametrize("metric", ["unweighted", "weighted"])
def test_every_path_and_block_size_gives_the_same_numbers(metric, monkeypatch):
    rng = np.random.default_rng(7)
    tree = random_tree(rng, 60, polytomies=True, zero_lengths=True)
    ids = [f"f{i}" for i in range(60)]
    counts = sp.csr_matrix(random_counts(rng, 45, 60, empty=(4, 30)))
    ref = skbio_distances(counts.toarray(), ids, tree, metric)
    for dense_cost in (0.0, 1e12):  # every node dense / every node sparse
        monkeypatch.setitem(engine.DENSE_COST, metric, dense_cost)
        assert_same(unifrac_matrix(counts, ids, tree, metric), ref)
    monkeypatch.setitem(engine.DENSE_COST, metric, 1.0)
    for name, value in (("ROW_BLOCK_ELEMENTS", 100), ("UNWEIGHTED_TILE", 7), ("PAIRS_PER_CHUNK", 5),
                        ("DENSE_BYTES", 45 * 3)):
        monkeypatch.setattr(engine, name, value)
        assert_same(unifrac_matrix(counts, ids, tree, metric), ref)


@pytest.mark.parametrize("metric", ["unweighted", "weighted"])
def test_no_size_dependent_switch(metric):
    """A pair's distance does not depend on how many other samples the table holds."""
    rng = np.random.default_rng(11)
    tree = random_tree(rng, 40)
    ids = [f"f{i}" for i in range(40)]
    big = sp.csr_matrix(random_counts(rng, 400, 40, empty=()))
    alone = unifrac_matrix(big[:5], ids, tree, metric)
    np.testing.assert_allclose(unifrac_matrix(big, ids, tree, metric)[:5, :5], alone, rtol=0, atol=1e-13)


def test_nonfinite_distances_are_kept_and_named():
    """Weighted normalized UniFrac between samples whose reads all sit at depth 0 (or none) is 0/0: NaN, as in
    scikit-bio, never turned into 0; the pairs are returned by sample ID."""
    tree = TreeNode.read(["((a:1,b:2):1,z:0);"])
    counts = np.array([[0, 0, 5], [1, 2, 0], [0, 0, 3], [0, 0, 0.0]])
    said = []
    targets = unifrac_targets(sp.csr_matrix(counts), ["a", "b", "z"], ["Z1", "AB", "Z2", "EMPTY"], tree, "weighted",
                              log=said.append, engine="builtin")
    ref = skbio_distances(counts, ["a", "b", "z"], tree, "weighted")
    assert np.isnan(ref[0, 2])
    assert_same(targets.distances, ref)
    assert targets.nonfinite_pairs == [("Z1", "Z2"), ("Z1", "EMPTY"), ("Z2", "EMPTY")]
    assert targets.n_nonfinite_pairs == 3 and np.isfinite(targets.distances[1]).all()
    assert any("WARNING: 3 UniFrac (weighted) distances are not finite" in line and "Z1/Z2 = nan" in line
               for line in said)
    assert any("1 samples have no reads" in line for line in said)


def test_missing_tip_is_an_input_error():
    tree = TreeNode.read(["(a:1,b:2);"])
    with pytest.raises(InputError, match="no tip for 1 of 3 features, e.g. 'c'"):
        unifrac_targets(sp.csr_matrix(np.ones((2, 3))), ["a", "b", "c"], ["S1", "S2"], tree, "unweighted",
                        log=lambda _: None)


def test_unrooted_tree_is_said():
    tree = TreeNode.read(["(a:1,b:2,c:3);"])
    said = []
    unifrac_targets(sp.csr_matrix(np.eye(3)), ["a", "b", "c"], ["S1", "S2", "S3"], tree, "unweighted",
                    log=said.append, engine="builtin")
    assert any(line.startswith("NOTICE: the tree's root has 3 children") for line in said)


@pytest.mark.parametrize("metric", ["unweighted", "weighted"])
def test_batch_submatrix_matches_direct_skbio(tiny_data, metric):
    dist = compute_unifrac(tiny_data.counts, tiny_data.asv_ids, tiny_data.sample_ids, tiny_data.tree, metric,
                           log=lambda *_: None)
    batch = Collator(tiny_data, dist, token_limit=24)([7, 2, 19, 11])
    assert batch["sample_ids"] == ["S8", "S3", "S20", "S12"]
    rows = tiny_data.counts[[7, 2, 19, 11]].toarray()
    direct = skbio_distances(rows, tiny_data.asv_ids, tiny_data.tree, metric)
    np.testing.assert_allclose(batch["unifrac"].numpy(), direct, atol=1e-6)
    assert batch["unifrac"][0, 1] > 0


def test_progress_is_logged_with_the_size_and_the_time(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setenv("DEBUG_NAN_CACHE_DIR", str(tmp_path))
    said = []
    unifrac_targets(tiny_data.counts, tiny_data.asv_ids, tiny_data.sample_ids, tiny_data.tree, "unweighted",
                    log=said.append, engine="builtin")
    assert said[0].startswith("Computing UniFrac (unweighted) with the built-in sparse engine")
    assert "24 samples x 72 features" in said[0] and "result 24x24 float64" in said[0]
    assert "took" in said[-1] and "cached in" in said[-1]
