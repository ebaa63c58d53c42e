import hashlib

import numpy as np
import pytest

from debug_nan.aam.data.loading import find_data_files, load_dataset
from debug_nan.aam.data.writing import write_biom, write_tree
from debug_nan.errors import InputError


@pytest.mark.parametrize("fmt", ["hdf5", "json"])
def test_biom_round_trip(tiny_data, tmp_path, fmt):
    table = write_biom(tiny_data, tmp_path / "t.biom", fmt)
    tree = write_tree(tiny_data, tmp_path / "t.nwk")
    data = load_dataset(table, tree, None, None, seed=0)
    assert data.sample_ids == tiny_data.sample_ids
    assert data.asv_ids == tiny_data.asv_ids
    np.testing.assert_array_equal(data.counts.toarray(), tiny_data.counts.toarray())
    np.testing.assert_array_equal(data.tokens, tiny_data.tokens)
    assert find_data_files(tmp_path) == (table, tree)


def _hashed_copy(data):
    import copy

    hashed = copy.copy(data)
    hashed.asv_ids = [hashlib.md5(s.encode()).hexdigest() for s in data.asv_ids]
    tree = data.tree.copy()
    for tip in tree.tips():
        tip.name = hashlib.md5(tip.name.encode()).hexdigest()
    hashed.tree = tree
    return hashed


def test_hashed_ids_with_fasta(tiny_data, tmp_path):
    hashed = _hashed_copy(tiny_data)
    table = write_biom(hashed, tmp_path / "t.biom")
    tree = write_tree(hashed, tmp_path / "t.nwk")
    fasta = tmp_path / "seqs.fasta"
    fasta.write_text("".join(f">{h} desc\n{s[:70]}\n{s[70:]}\n" for h, s in zip(hashed.asv_ids, tiny_data.asv_ids)))
    data = load_dataset(table, tree, str(fasta), None, seed=0)
    assert data.sequences == tiny_data.asv_ids
    np.testing.assert_array_equal(data.tokens, tiny_data.tokens)


def test_hashed_ids_without_fasta_is_a_clear_error(tiny_data, tmp_path):
    hashed = _hashed_copy(tiny_data)
    table = write_biom(hashed, tmp_path / "t.biom")
    tree = write_tree(hashed, tmp_path / "t.nwk")
    with pytest.raises(InputError, match=r"look like hashes.*--sequences"):
        load_dataset(table, tree, None, None, seed=0)


def test_tree_missing_table_ids(tiny_data, tmp_path):
    table = write_biom(tiny_data, tmp_path / "t.biom")
    tree = tiny_data.tree.copy()
    names = [t.name for t in tree.tips()]
    pruned = tree.shear(names[5:])
    (tmp_path / "t.nwk").write_text(str(pruned))
    with pytest.raises(InputError, match=r"no tip for 5 of the 72 observation IDs"):
        load_dataset(table, tmp_path / "t.nwk", None, None, seed=0)


def test_rarefaction_drops_shallow_samples(tiny_data, tmp_path):
    table = write_biom(tiny_data, tmp_path / "t.biom")
    tree = write_tree(tiny_data, tmp_path / "t.nwk")
    depth = int(np.median(np.asarray(tiny_data.counts.sum(axis=1)).ravel()))
    data = load_dataset(table, tree, None, depth, seed=0)
    sums = np.asarray(data.counts.sum(axis=1)).ravel()
    assert (sums == depth).all()
    assert 0 < data.n_samples < tiny_data.n_samples
    with pytest.raises(InputError, match="empty after rarefaction"):
        load_dataset(table, tree, None, 10**9, seed=0)


def test_corrupt_and_empty_inputs(tiny_data, tmp_path):
    bad = tmp_path / "bad.biom"
    bad.write_text("this is not biom")
    with pytest.raises(InputError, match=r"bad.biom could not be read"):
        load_dataset(bad, write_tree(tiny_data, tmp_path / "t.nwk"), None, None, seed=0)
    with pytest.raises(InputError, match="no Newick tree"):
        load_dataset(write_biom(tiny_data, tmp_path / "t.biom"), None, None, None, seed=0)


def test_long_steps_are_logged_with_size_and_time(tiny_data, tmp_path):
    table = write_biom(tiny_data, tmp_path / "t.biom")
    tree = write_tree(tiny_data, tmp_path / "t.nwk")
    lines = []
    load_dataset(table, tree, None, None, seed=0, log=lines.append)
    size = table.stat().st_size / 1024
    assert lines[0] == f"Reading BIOM table {table} ({size:.1f} KB) ..."
    assert lines[1].startswith(f"Loaded BIOM table {table}: 24 samples x 72 ASVs (601 non-zero counts) in ")
    assert lines[2:4] == ["Tokenising 72 ASV sequences ...", lines[3]]
    assert lines[3].startswith("Tokenised 72 ASV sequences into 72 x 151 tokens in ")
    assert lines[5].startswith(f"Loaded tree {tree}: 72 tips cover all 72 ASVs in ") and lines[5].endswith(" s.")


def test_notices_travel_with_the_dataset(tiny_data, tmp_path):
    import dataclasses

    import scipy.sparse as sp

    dense = tiny_data.counts.toarray() / 4
    dense[0] = 0
    table = write_biom(dataclasses.replace(tiny_data, counts=sp.csr_matrix(dense)), tmp_path / "t.biom")
    data = load_dataset(table, write_tree(tiny_data, tmp_path / "t.nwk"), None, None, seed=0)
    notices = [n for n in data.notes if n.startswith("NOTICE:")]
    assert len(notices) >= 2 and "fractional counts" in notices[0] and "1 of 24 samples" in notices[1]
    assert data.n_samples == 23 and "S1" not in data.sample_ids
    assert np.all(np.diff(data.counts.indptr) > 0)  # no empty sample reaches the batches
