"""Striped UniFrac (biocore's `unifrac`) is used first when importable; the built-in engine otherwise."""

import sys
import types

import numpy as np
import pytest

from debug_nan.aam.data.unifrac import unifrac_matrix, unifrac_targets
from debug_nan.aam.data.unifrac_striped import striped_version
from debug_nan.errors import InputError

INSTALLED = striped_version() is not None


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DEBUG_NAN_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.skipif(not INSTALLED, reason="biocore's unifrac is not installed (conda / Debian python3-unifrac)")
@pytest.mark.parametrize("metric", ["unweighted", "weighted"])
def test_real_striped_unifrac_agrees_with_the_builtin_engine(tiny_data, metric, fresh_cache):
    said = []
    targets = unifrac_targets(tiny_data.counts, tiny_data.asv_ids, tiny_data.sample_ids, tiny_data.tree, metric,
                              log=said.append)
    assert targets.engine.startswith("unifrac ") and "Striped UniFrac" in said[0]
    expected = unifrac_matrix(tiny_data.counts, tiny_data.asv_ids, tiny_data.tree, metric)
    np.testing.assert_allclose(targets.distances, expected, rtol=0, atol=1e-9)


@pytest.mark.skipif(INSTALLED, reason="the unifrac package is installed here")
def test_without_the_package(tiny_data, fresh_cache):
    said = []
    targets = unifrac_targets(tiny_data.counts, tiny_data.asv_ids, tiny_data.sample_ids, tiny_data.tree,
                              "unweighted", log=said.append)
    assert targets.engine == "the built-in sparse engine" and "built-in sparse engine" in said[0]
    with pytest.raises(InputError, match="engine 'striped' was asked for, but the `unifrac` package cannot"):
        unifrac_targets(tiny_data.counts, tiny_data.asv_ids, tiny_data.sample_ids, tiny_data.tree, "unweighted",
                        log=said.append, engine="striped")


def fake_unifrac(fail: bool = False) -> types.ModuleType:
    """A stand-in with Striped UniFrac's file API (BIOM 2.1 + Newick paths in, DistanceMatrix out), computed by
    scikit-bio, returning the samples in reverse order: exercises the adapter where the real one is absent."""
    import biom
    from skbio import TreeNode
    from skbio.diversity import beta_diversity

    def make(metric):
        def run(table_path, tree_path, *args, **kwargs):
            if fail:
                raise RuntimeError("libssu exploded")
            table = biom.load_table(table_path)
            ids = list(table.ids())[::-1]
            counts = table.sort_order(ids).matrix_data.toarray().T
            extra = {"normalized": True} if metric == "weighted" else {}
            tree = TreeNode.read(tree_path)
            return beta_diversity(f"{metric}_unifrac", counts, ids=ids, taxa=list(table.ids("observation")),
                                  tree=tree, validate=False, **extra)
        return run

    module = types.ModuleType("unifrac")
    module.__version__ = "0.0-fake"
    module.unweighted, module.weighted_normalized = make("unweighted"), make("weighted")
    return module


@pytest.mark.parametrize("metric", ["unweighted", "weighted"])
def test_adapter_writes_the_files_and_reorders_the_samples(tiny_data, metric, fresh_cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "unifrac", fake_unifrac())
    said = []
    targets = unifrac_targets(tiny_data.counts, tiny_data.asv_ids, tiny_data.sample_ids, tiny_data.tree, metric,
                              log=said.append)
    assert targets.engine == "unifrac 0.0-fake (Striped UniFrac)"
    assert said[0].startswith(f"Computing UniFrac ({metric}) with unifrac 0.0-fake (Striped UniFrac): 24 samples")
    expected = unifrac_matrix(tiny_data.counts, tiny_data.asv_ids, tiny_data.tree, metric)
    np.testing.assert_allclose(targets.distances, expected, rtol=0, atol=1e-12)


def test_a_failing_striped_run_falls_back_to_the_builtin_engine(tiny_data, fresh_cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "unifrac", fake_unifrac(fail=True))
    said = []
    targets = unifrac_targets(tiny_data.counts, tiny_data.asv_ids, tiny_data.sample_ids, tiny_data.tree,
                              "unweighted", log=said.append)
    assert any("Striped UniFrac failed (RuntimeError: libssu exploded); using the built-in sparse engine instead"
               in line for line in said)
    assert targets.engine == "the built-in sparse engine"
    expected = unifrac_matrix(tiny_data.counts, tiny_data.asv_ids, tiny_data.tree, "unweighted")
    np.testing.assert_allclose(targets.distances, expected, rtol=0, atol=1e-15)
    with pytest.raises(InputError, match="Striped UniFrac failed"):
        unifrac_targets(tiny_data.counts, tiny_data.asv_ids, tiny_data.sample_ids, tiny_data.tree, "weighted",
                        log=said.append, engine="striped")
