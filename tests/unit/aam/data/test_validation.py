"""One test per data rule: what the field's tools refuse is an InputError naming the file, the IDs and their count;
what they accept with a caveat is a NOTICE line."""

import json
import os

import biom
import h5py
import numpy as np
import pytest
import scipy.sparse as sp
import skbio

from debug_nan.aam.data.loading import drop_empty, find_data_files
from debug_nan.aam.data.progress import Phase, human_bytes
from debug_nan.aam.data.readers import check_input_file, load_biom, load_tree, read_fasta
from debug_nan.aam.data.validation import (
    check_counts,
    check_sequences,
    check_tree,
    check_tree_length,
    check_unique_ids,
    some,
)
from debug_nan.errors import InputError

SAMPLES = ["S1", "S2", "S3"]
ASVS = ["AAAA", "CCCC"]


def _counts(rows):
    """rows: [S][N] -> CSR [S, N]."""
    return sp.csr_matrix(np.array(rows, dtype=np.float64))


def _tree(newick: str):
    import io

    return skbio.TreeNode.read(io.StringIO(newick), format="newick")


def _write_hdf5(table, path):
    with h5py.File(path, "w") as handle:
        table.to_hdf5(handle, "test")
    return path


# --- counts -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("value, word", [(np.nan, "nan"), (np.inf, "inf"), (-np.inf, "-inf")])
def test_non_finite_counts_name_sample_and_asv(value, word):
    with pytest.raises(InputError, match="non-finite counts") as err:
        check_counts(_counts([[1, 2], [3, value], [0, 1]]), SAMPLES, ASVS, "t.biom")
    assert f"1 count in 1 sample, e.g. sample 'S2' / ASV 'CCCC' = {word}" in str(err.value)


def test_negative_counts_are_counted_and_named():
    with pytest.raises(InputError, match="negative counts") as err:
        check_counts(_counts([[-1, 2], [3, -4], [0, -1]]), SAMPLES, ASVS, "t.biom")
    msg = str(err.value)
    assert "3 counts in 3 samples" in msg and "sample 'S1' / ASV 'AAAA' = -1" in msg and "CLR" in msg


def test_fractional_counts_are_a_notice():
    notes = check_counts(_counts([[0.25, 2], [3, 0.5], [1, 1]]), SAMPLES, ASVS, "t.biom")
    assert len(notes) == 1 and notes[0].startswith("NOTICE: BIOM table t.biom holds fractional counts (2 counts")
    assert "Unweighted UniFrac uses only presence/absence" in notes[0]
    assert check_counts(_counts([[1, 2], [3, 4], [0, 0]]), SAMPLES, ASVS, "t.biom") == []


def test_zero_read_samples_and_asvs_are_dropped_with_a_notice():
    table = biom.Table(np.array([[0, 5, 0, 1], [0, 0, 0, 0], [0, 2, 0, 3]]), ["a", "b", "c"], ["s1", "s2", "s3", "s4"])
    kept, notes = drop_empty(table, "t.biom")
    assert list(kept.ids()) == ["s2", "s4"] and list(kept.ids(axis="observation")) == ["a", "c"]
    assert notes[0].startswith("NOTICE: 2 of 4 samples of t.biom have no reads and were dropped: 's1', 's3'")
    assert notes[1].startswith("NOTICE: 1 of 3 ASVs of t.biom have no reads in any sample")
    with pytest.raises(InputError, match=r"t.biom is empty \(3 observations x 4 samples, total count 0\)"):
        drop_empty(biom.Table(np.zeros((3, 4)), ["a", "b", "c"], ["s1", "s2", "s3", "s4"]), "t.biom")


# --- IDs ----------------------------------------------------------------------------------------------------------

def test_duplicate_ids_are_named_with_their_count():
    with pytest.raises(InputError) as err:
        check_unique_ids(["a", "b", "a", "c", "a", "b"], "sample ID", "BIOM table t.biom", "rename them.")
    assert "BIOM table t.biom has 2 duplicate sample IDs: 'a' (3 times), 'b' (2 times)." in str(err.value)
    check_unique_ids(["a", "b"], "sample ID", "x", "y")


@pytest.mark.parametrize("axis, path", [("sample", "sample/ids"), ("observation", "observation/ids")])
def test_duplicate_ids_in_hdf5_biom(tmp_path, axis, path):
    table = biom.Table(np.array([[1, 2, 3], [4, 5, 6]]), ["o1", "o2"], ["s1", "s2", "s3"])
    f = _write_hdf5(table, tmp_path / "t.biom")
    with h5py.File(f, "r+") as handle:
        handle[path][1] = handle[path][0]
    with pytest.raises(InputError, match=f"t.biom has 1 duplicate {axis} ID: '[os]1' \\(2 times\\)"):
        load_biom(f)


def test_duplicate_ids_in_json_biom(tmp_path):
    table = biom.Table(np.array([[1, 2], [4, 5]]), ["o1", "o2"], ["s1", "s2"])
    parsed = json.loads(table.to_json("test"))
    parsed["rows"][1]["id"] = "o1"
    (tmp_path / "t.biom").write_text(json.dumps(parsed))
    with pytest.raises(InputError, match="has 1 duplicate observation ID: 'o1' \\(2 times\\)"):
        load_biom(tmp_path / "t.biom")


def test_nan_in_json_biom_as_biom_format_writes_it(tmp_path):
    table = biom.Table(np.array([[1.0, np.nan], [4.0, 5.0]]), ["o1", "o2"], ["s1", "s2"])
    (tmp_path / "t.biom").write_text(table.to_json("test"))  # writes a bare `nan`, which biom cannot read back
    with pytest.raises(InputError, match="non-finite counts .*sample 's2' / ASV 'o1' = nan"):
        load_biom(tmp_path / "t.biom")


# --- unreadable files ---------------------------------------------------------------------------------------------

def test_truncated_and_wrong_biom_files(tmp_path):
    table = biom.Table(np.array([[1, 2], [4, 5]]), ["o1", "o2"], ["s1", "s2"])
    good = _write_hdf5(table, tmp_path / "good.biom").read_bytes()
    (tmp_path / "cut.biom").write_bytes(good[:len(good) // 2])
    with pytest.raises(InputError, match=f"cut.biom could not be read: it is a truncated HDF5 file "
                                         f"\\({len(good) // 2:,} "
                                         f"of the {len(good):,} bytes"):
        load_biom(tmp_path / "cut.biom")
    (tmp_path / "cut.json.biom").write_text(table.to_json("test")[:150])
    with pytest.raises(InputError, match="the JSON ends early .*truncated"):
        load_biom(tmp_path / "cut.json.biom")
    (tmp_path / "empty.biom").write_bytes(b"")
    with pytest.raises(InputError, match=r"empty.biom could not be read: the file is empty \(0 bytes\)"):
        load_biom(tmp_path / "empty.biom")
    with h5py.File(tmp_path / "other.biom", "w") as handle:
        handle["x"] = 1
    with pytest.raises(InputError, match="other.biom could not be read: it is an HDF5 file but not a BIOM table"):
        load_biom(tmp_path / "other.biom")


def test_paths_that_are_not_files_say_what_they_are(tmp_path):
    folder = tmp_path / "x.biom"
    folder.mkdir()
    (folder / "feature-table.biom").write_text("{}")
    with pytest.raises(InputError, match="x.biom is a directory, not a file. It holds 'feature-table.biom'"):
        check_input_file(folder, "BIOM table")
    loop = tmp_path / "loop.biom"
    loop.symlink_to(loop)
    with pytest.raises(InputError, match="loop.biom is a symbolic link loop"):
        check_input_file(loop, "BIOM table")
    dangling = tmp_path / "dangling.nwk"
    dangling.symlink_to(tmp_path / "gone.nwk")
    with pytest.raises(InputError, match="dangling.nwk is a symbolic link to .*gone.nwk, which does not exist"):
        check_input_file(dangling, "Tree")
    fifo = tmp_path / "pipe.fasta"
    os.mkfifo(fifo)
    with pytest.raises(InputError, match=r"pipe.fasta \(given with --sequences\) is a FIFO, not a regular file"):
        check_input_file(fifo, "FASTA", "--sequences")
    with pytest.raises(InputError, match="nope.biom does not exist"):
        check_input_file(tmp_path / "nope.biom", "BIOM table")


def test_truncated_newick_and_non_utf8_bytes(tmp_path):
    (tmp_path / "cut.nwk").write_text("((a:1,b:2):0.5,(c:1,")
    with pytest.raises(InputError, match=r"cut.nwk is not a readable Newick tree: it does not end with ';' \(3 '\(' "
                                         r"and 1 '\)'.*looks truncated"):
        load_tree(tmp_path / "cut.nwk")
    (tmp_path / "latin.nwk").write_bytes(b"((a:1,b:2):0.5,\n(caf\xe9:1,d:2):1);\n")
    with pytest.raises(InputError, match="latin.nwk is not UTF-8 text: line 2, column 5 holds the byte 0xE9"):
        load_tree(tmp_path / "latin.nwk")
    (tmp_path / "empty.nwk").write_text("\n")
    with pytest.raises(InputError, match="empty.nwk is empty"):
        load_tree(tmp_path / "empty.nwk")


# --- tree ---------------------------------------------------------------------------------------------------------

def test_duplicate_tip_names():
    with pytest.raises(InputError, match="Tree t.nwk has 1 duplicate tip name: 'a' \\(2 times\\)"):
        check_tree(_tree("((a:1,b:2):1,(a:1,c:2):1);"), "t.nwk")


def test_negative_and_non_finite_branch_lengths():
    with pytest.raises(InputError, match=r"2 negative branch lengths: 'b' \(-2\), the internal node above 'c', 'd' "
                                         r"\(-0.5\)"):
        check_tree(_tree("((a:1,b:-2):1,(c:1,d:2):-0.5);"), "t.nwk")
    with pytest.raises(InputError, match=r"1 non-finite branch length \(NaN or Inf\): 'c' \(inf\)"):
        check_tree(_tree("((a:1,b:2):1,c:inf);"), "t.nwk")


def test_all_zero_or_all_missing_lengths():
    with pytest.raises(InputError, match="has no branch lengths \\(a topology only, 5 branches\\)"):
        check_tree(_tree("((a,b),(c));"), "t.nwk")
    with pytest.raises(InputError, match="all 5 branch lengths are 0"):
        check_tree(_tree("((a:0,b:0):0,(c:0)x:0);"), "t.nwk")


def test_a_few_missing_lengths_are_zero_with_a_notice():
    tree = _tree("((a:1,b):1,(c:1,d:2):1,(e:1,f:1):1);")
    notes = check_tree(tree, "t.nwk")
    assert notes == ["NOTICE: Tree t.nwk: 1 of its 9 branches have no length ('b'); they are treated as 0 (they add "
                     "nothing to any distance). scikit-bio's validated UniFrac refuses such a tree; give every branch "
                     "a length to silence this."]
    assert tree.find("b").length == 0.0
    with pytest.raises(InputError, match="5 of its 6 branches have no length"):
        check_tree(_tree("((a,b),(c:1,d));"), "t.nwk")


def test_zero_length_left_after_shearing_to_the_table():
    tree = _tree("((a:0,b:0):0,(c:1,d:2):1);")
    check_tree(tree, "t.nwk")  # the whole tree has length
    sheared = tree.shear(["a", "b"])
    with pytest.raises(InputError, match="connect the table's 2 ASVs all have length 0"):
        check_tree_length(sheared, "t.nwk", 2)
    check_tree_length(tree.shear(["a", "c"]), "t.nwk", 2)


# --- sequences and FASTA ------------------------------------------------------------------------------------------

def test_empty_gapped_and_all_ambiguous_sequences():
    check_sequences(["x", "y"], ["ACGT", "ACNNT"], "FASTA s.fa")
    with pytest.raises(InputError, match="FASTA s.fa: 1 ASV with an empty sequence: 'y'"):
        check_sequences(["x", "y"], ["ACGT", ""], "FASTA s.fa")
    with pytest.raises(InputError, match="2 ASV sequences with alignment gaps .*'x', 'y'.*aligned"):
        check_sequences(["x", "y", "z"], ["AC-GT", "AC..GT", "ACGT"], "FASTA s.fa")
    with pytest.raises(InputError, match="1 ASV sequence made only of ambiguous bases .*'z'"):
        check_sequences(["x", "z"], ["ACGT", "NNNRYn"], "FASTA s.fa")


def test_fasta_duplicates_bad_bytes_and_headers(tmp_path):
    fa = tmp_path / "s.fasta"
    fa.write_text(">a\nACGT\n>b desc\nCC\nGG\n>a\nTTTT\n")
    with pytest.raises(InputError, match=r"s.fasta has 1 repeated ID: 'a' \(lines 1, 6\)"):
        read_fasta(fa)
    fa.write_bytes(b">a\nACGT\n>b caf\xc3\xa9\nCC\n>c \xff\nGG\n")
    with pytest.raises(InputError, match="s.fasta is not UTF-8 text: line 5, column 4 holds the byte 0xFF"):
        read_fasta(fa)
    fa.write_text(">a\nACGT\n>\nCC\n")
    with pytest.raises(InputError, match="s.fasta, line 3: a '>' header without an ID"):
        read_fasta(fa)
    fa.write_bytes(b"\xef\xbb\xbf>a\nAC\nGT\n>b\nCC\n")  # a UTF-8 byte-order mark is fine
    assert read_fasta(fa) == {"a": "ACGT", "b": "CC"}


# --- folders ------------------------------------------------------------------------------------------------------

def test_explicit_data_dir_must_exist_and_hold_a_table(tmp_path):
    assert find_data_files(tmp_path / "absent") == (None, None)  # the default ./data: no data asked for
    with pytest.raises(InputError, match="--data-dir .*absent does not exist"):
        find_data_files(tmp_path / "absent", required=True)
    (tmp_path / "table.qza").write_bytes(b"PK")
    (tmp_path / "tree.nwk").write_text("(a:1,b:1);")
    (tmp_path / "sub").mkdir()
    with pytest.raises(InputError, match=r"holds no BIOM table \(\*.biom\): it holds 'sub/', 'table.qza', "
                                         r"'tree.nwk'; a QIIME 2 artifact \(.qza\) must be exported first"):
        find_data_files(tmp_path, required=True)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(InputError, match="--data-dir .*loop is a symbolic link loop"):
        find_data_files(loop)


# --- helpers ------------------------------------------------------------------------------------------------------

def test_phase_logs_before_and_after_and_helpers():
    lines = []
    with Phase(lines.append, "Reading x (1.0 KB)") as phase:
        phase.done("Read x: 3 rows")
    assert lines[0] == "Reading x (1.0 KB) ..." and lines[1].startswith("Read x: 3 rows in ")
    lines.clear()
    with pytest.raises(ValueError), Phase(lines.append, "Failing"):
        raise ValueError
    assert lines == ["Failing ..."]  # no "done" line for a step that failed
    assert human_bytes(512) == "512 bytes" and human_bytes(1536) == "1.5 KB" and human_bytes(3 * 1024**3) == "3.0 GB"
    assert some(["a", "b", "c", "d"]) == "'a', 'b', 'c' and 1 more"
