import numpy as np
import pytest

from debug_nan.data.batches import Collator
from debug_nan.data.unifrac import compute_unifrac, unifrac_matrix, unifrac_skbio


@pytest.mark.parametrize("metric", ["unweighted", "weighted"])
def test_batch_submatrix_matches_direct_skbio(tiny_data, metric):
    from skbio.diversity import beta_diversity

    dist = compute_unifrac(tiny_data.counts, tiny_data.asv_ids, tiny_data.sample_ids, tiny_data.tree, metric,
                           log=lambda *_: None)
    batch = Collator(tiny_data, dist, token_limit=24)([7, 2, 19, 11])
    assert batch["sample_ids"] == ["S8", "S3", "S20", "S12"]
    rows = np.rint(tiny_data.counts[[7, 2, 19, 11]].toarray()).astype(int)
    kwargs = {"normalized": True} if metric == "weighted" else {}
    direct = beta_diversity(f"{metric}_unifrac", rows, ids=batch["sample_ids"], taxa=tiny_data.asv_ids,
                            tree=tiny_data.tree, **kwargs)
    np.testing.assert_allclose(batch["unifrac"].numpy(), direct.data, atol=1e-6)
    assert batch["unifrac"][0, 1] > 0


@pytest.mark.parametrize("metric", ["unweighted", "weighted"])
def test_matrix_backend_equals_skbio(tiny_data, metric):
    a = unifrac_skbio(tiny_data.counts, tiny_data.asv_ids, tiny_data.tree, metric)
    b = unifrac_matrix(tiny_data.counts, tiny_data.asv_ids, tiny_data.tree, metric)
    blocks = unifrac_matrix(tiny_data.counts, tiny_data.asv_ids, tiny_data.tree, metric, block_rows=5)
    np.testing.assert_allclose(a, b, atol=1e-12)
    np.testing.assert_allclose(blocks, b, atol=1e-12)


def test_cache_is_reused_and_lives_outside_the_data(tiny_data, tmp_path, monkeypatch):
    monkeypatch.setenv("DEBUG_NAN_CACHE_DIR", str(tmp_path / "c"))
    said = []
    first = compute_unifrac(tiny_data.counts, tiny_data.asv_ids, tiny_data.sample_ids, tiny_data.tree,
                            "unweighted", log=said.append)
    second = compute_unifrac(tiny_data.counts, tiny_data.asv_ids, tiny_data.sample_ids, tiny_data.tree,
                             "unweighted", log=said.append)
    np.testing.assert_array_equal(first, second)
    assert "took" in said[-2] and "read from cache" in said[-1]
    assert len(list((tmp_path / "c" / "unifrac").glob("*.npy"))) == 1
