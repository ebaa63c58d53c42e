"""A caterpillar tree too deep for the memory left is refused before its paths are built (aam/data/unifrac.py)."""

from __future__ import annotations

import pytest


def _caterpillar(n: int):
    import io

    from skbio import TreeNode

    newick = "t0"
    for k in range(1, n):
        newick = f"({newick}:1,t{k}:1)"
    return TreeNode.read(io.StringIO(newick + ";"))


def test_a_caterpillar_tree_past_the_memory_is_refused_before_its_paths_are_built(monkeypatch):
    """n tips, n levels: n^2 / 2 path entries. With 1 MB to give, 300 tips (45,450 entries) are refused, the same
    tree's 100 shallowest tips (5,150 entries) are built; the path lengths agree with scikit-bio's ancestors."""
    import numpy as np

    from debug_nan.aam.data import unifrac_sparse
    from debug_nan.errors import InputError

    monkeypatch.setattr(unifrac_sparse, "available_bytes", lambda: 2**20)
    tree = _caterpillar(300)
    with pytest.raises(InputError, match=r"The tree is 300 nodes deep: the tip-to-root paths of the table's 300 "
                                         r"ASVs that UniFrac needs hold 45,449 entries"):
        unifrac_sparse.tree_arrays(tree, [f"t{k}" for k in range(300)])
    arrays = unifrac_sparse.tree_arrays(tree, [f"t{k}" for k in range(200, 300)])
    assert arrays.ancestors.nnz == 5150  # tips t200..t299 sit 101..2 nodes from the root (itself included)
    nodes = list(tree.postorder(include_self=True))
    index = {id(n): k for k, n in enumerate(nodes)}
    parent = np.array([index[id(n.parent)] if n.parent is not None else -1 for n in nodes])
    expected = [len(list(n.ancestors())) + 1 for n in nodes]
    assert unifrac_sparse.path_lengths(parent).tolist() == expected
