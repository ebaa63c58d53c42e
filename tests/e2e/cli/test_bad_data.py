"""Bad data through the CLI, table-driven: every case is one row of CASES.

A row is Case(id, write, args, code, message): `write(d, data)` puts the inputs into the empty folder d (data is
the tiny 24-sample synthetic Dataset), `args` are the CLI arguments after `--config tiny.toml` ("{d}" is replaced
by the folder), then the expected exit code and a substring of the output. For every row: the exit code, the
substring, no traceback, every input byte-identical after the run, and the --report file holds valid JSON with
the status and the real exit code. To add a case, add a row.
"""

from __future__ import annotations

import copy
import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import h5py
import numpy as np
import pytest
import scipy.sparse as sp

from debug_nan.aam.data.writing import to_biom_table, write_biom, write_tree
from tests.conftest import TINY
from tests.support.files import fingerprint


@dataclass
class Case:
    id: str
    write: Callable[[Path, object], None]
    args: tuple[str, ...]
    code: int
    message: str
    marks: list = field(default_factory=list)


DATA_DIR = ("--data-dir", "{d}")
ONE_SMALL_STEP = ("--max-steps", "1", "--batch-size", "2")  # the accepted cases train, as briefly as possible


# --- writers: build the inputs of one case ------------------------------------------------------------------------

def good(d: Path, data, fmt: str = "hdf5") -> None:
    write_biom(data, d / "table.biom", fmt)
    write_tree(data, d / "tree.nwk")


def with_counts(transform, fmt: str = "hdf5", **changes):
    """The table's dense counts [S, N] passed through `transform` (biom-format writes NaN/Inf/negatives freely)."""
    def write(d, data):
        good(d, replace(data, counts=sp.csr_matrix(transform(data.counts.toarray())), **changes), fmt)
    return write


def with_count(value: float, fmt: str = "hdf5"):
    """Sample S3's count of the sixth ASV set to `value`."""
    return with_counts(lambda c: np.where((np.arange(c.shape[0]) == 2)[:, None] & (np.arange(c.shape[1]) == 5),
                                          value, c), fmt)


def hdf5_ids(axis: str):
    """The second ID of `axis` set equal to the first, in the HDF5 file (biom-format refuses to write that)."""
    def write(d, data):
        good(d, data)
        with h5py.File(d / "table.biom", "r+") as handle:
            handle[f"{axis}/ids"][1] = handle[f"{axis}/ids"][0]
    return write


def json_duplicate_observation(d, data):
    good(d, data)
    parsed = json.loads(to_biom_table(data).to_json("test"))
    parsed["rows"][3]["id"] = parsed["rows"][0]["id"]
    (d / "table.biom").write_text(json.dumps(parsed))


def json_sample_renamed(raw: bytes):
    """A JSON table whose first sample ID is the raw bytes `raw` (e.g. Latin-1, not UTF-8)."""
    def write(d, data):
        good(d, data, "json")
        blob = (d / "table.biom").read_bytes()
        (d / "table.biom").write_bytes(blob.replace(b'"id": "S1"', b'"id": "' + raw + b'"', 1))
    return write


def with_tree(edit):
    """The tree written after `edit(tree)` changed its copy."""
    def write(d, data):
        tree = data.tree.copy()
        edit(tree)
        good(d, replace(data, tree=tree))
    return write


def _duplicate_tip(tree):
    tips = list(tree.tips())
    tips[1].name = tips[0].name


def _set_lengths(value):
    def edit(tree):
        for node in tree.traverse(include_self=False):
            node.length = value
    return edit


def _first_tip_length(value):
    def edit(tree):
        next(iter(tree.tips())).length = value
    return edit


def _drop_first_tip(tree):
    tip = next(iter(tree.tips()))
    tip.parent.remove(tip)


def _most_lengths_missing(tree):
    for k, node in enumerate(tree.traverse(include_self=False)):
        if k % 4:
            node.length = None


def _some_lengths_missing(tree):
    for tip in list(tree.tips())[:3]:
        tip.length = None


def hashed(fasta_text: Callable[[list[str], list[str]], str]):
    """Hashed observation IDs (as QIIME 2 exports them) with a FASTA built by fasta_text(hashes, sequences)."""
    def write(d, data):
        rename = {s: hashlib.md5(s.encode()).hexdigest() for s in data.asv_ids}
        tree = data.tree.copy()
        for tip in tree.tips():
            tip.name = rename[tip.name]
        out = replace(data, asv_ids=[rename[s] for s in data.asv_ids], tree=tree)
        good(d, out)
        text = fasta_text([rename[s] for s in data.asv_ids], list(data.asv_ids))
        (d / "seqs.fasta").write_bytes(text.encode("utf-8", "surrogateescape"))
    return write


def _fasta(ids, seqs):
    return "".join(f">{i}\n{s}\n" for i, s in zip(ids, seqs))


def renamed_ids(rename):
    """Observation IDs (and tips) renamed; without a FASTA they are read as the sequences."""
    def write(d, data):
        tree = data.tree.copy()
        for tip in tree.tips():
            tip.name = rename(tip.name)
        good(d, replace(data, asv_ids=[rename(s) for s in data.asv_ids], tree=tree))
    return write


def truncated(name: str, fmt: str = "hdf5", keep: float = 0.5):
    def write(d, data):
        good(d, data, fmt)
        blob = (d / name).read_bytes()
        (d / name).write_bytes(blob[:int(len(blob) * keep)])
    return write


def tree_bytes(blob: bytes):
    def write(d, data):
        good(d, data)
        (d / "tree.nwk").write_bytes(blob)
    return write


def table_is_dir(d, data):
    write_tree(data, d / "tree.nwk")
    (d / "table.biom").mkdir()
    write_biom(data, d / "table.biom" / "feature-table.biom")


def table_link_loop(d, data):
    write_tree(data, d / "tree.nwk")
    (d / "table.biom").symlink_to(d / "table.biom")


def tree_dangling_link(d, data):
    write_biom(data, d / "table.biom")
    (d / "tree.nwk").symlink_to(d / "gone.nwk")


def only(*names):
    """A folder that holds only these (non-table) files."""
    def write(d, data):
        for name in names:
            (d / name).write_text("x")
    return write


def nothing(d, data):
    pass


def config_with_missing_data_dir(d, data):
    (d / "job.toml").write_text('[data]\ndata_dir = "no-such-folder"\ntoken_limit = 24\nbatch_size = 4\n')


def fasta_fifo(d, data):
    hashed(_fasta)(d, data)
    os.mkfifo(d / "pipe")


# --- the cases ----------------------------------------------------------------------------------------------------

CASES = [
    # counts
    Case("nan-count-hdf5", with_count(np.nan), DATA_DIR, 2, "holds non-finite counts (NaN or Inf): 1 count in 1 "
                                                             "sample, e.g. sample 'S3'"),
    Case("inf-count-hdf5", with_count(np.inf), DATA_DIR, 2, "= inf"),
    Case("nan-count-json", with_count(np.nan, fmt="json"), DATA_DIR, 2, "holds non-finite counts"),
    Case("negative-count", with_count(-3.0), DATA_DIR, 2, "holds negative counts: 1 count in 1 sample"),
    Case("all-counts-zero", with_counts(lambda c: c * 0), DATA_DIR, 2, "is empty (72 observations x 24 samples, "
                                                                        "total count 0)"),
    Case("no-samples", with_counts(lambda c: c[:0], sample_ids=[]), DATA_DIR, 2,
         "is empty (72 observations x 0 samples"),
    Case("fractional-counts-with-rarefy", with_counts(lambda c: c / 7), (*DATA_DIR, "--rarefy-depth", "5"), 2,
         "--rarefy-depth 5 needs integer read counts"),
    # IDs
    Case("duplicate-sample-ids", hdf5_ids("sample"), DATA_DIR, 2, "has 1 duplicate sample ID: 'S1' (2 times)"),
    Case("duplicate-observation-ids-hdf5", hdf5_ids("observation"), DATA_DIR, 2, "has 1 duplicate observation ID"),
    Case("duplicate-observation-ids-json", json_duplicate_observation, DATA_DIR, 2, "1 duplicate observation ID:"),
    # tree
    Case("duplicate-tip-names", with_tree(_duplicate_tip), DATA_DIR, 2, "has 1 duplicate tip name:"),
    Case("negative-branch-length", with_tree(_first_tip_length(-0.25)), DATA_DIR, 2, "1 negative branch length:"),
    Case("nan-branch-length", with_tree(_first_tip_length(float("nan"))), DATA_DIR, 2, "1 non-finite branch length "
                                                                                       "(NaN or Inf)"),
    Case("all-branch-lengths-zero", with_tree(_set_lengths(0.0)), DATA_DIR, 2, "all 142 branch lengths are 0"),
    Case("no-branch-lengths", with_tree(_set_lengths(None)), DATA_DIR, 2, "has no branch lengths (a topology only"),
    Case("most-branch-lengths-missing", with_tree(_most_lengths_missing), DATA_DIR, 2,
         "106 of its 142 branches have no length"),
    Case("tree-missing-tips", with_tree(_drop_first_tip), DATA_DIR, 2,
         "has no tip for 1 of the 72 observation IDs"),
    Case("truncated-newick", tree_bytes(b"((a:1,b:2):0.5,(c:1,"), DATA_DIR, 2, "looks truncated"),
    Case("newick-not-utf8", tree_bytes(b"((a:1,b:2):0.5,\n(caf\xe9:1,d:2):1);\n"), DATA_DIR, 2,
         "is not UTF-8 text: line 2, column 5 holds the byte 0xE9"),
    Case("tree-dangling-link", tree_dangling_link, DATA_DIR, 2, "which does not exist"),
    # sequences
    Case("fasta-duplicate-id", hashed(lambda i, s: _fasta(i, s) + f">{i[0]}\n{s[0]}\n"),
         (*DATA_DIR, "--sequences", "{d}/seqs.fasta"), 2, "has 1 repeated ID:"),
    Case("fasta-empty-sequence", hashed(lambda i, s: _fasta(i, ["", *s[1:]])),
         (*DATA_DIR, "--sequences", "{d}/seqs.fasta"), 2, "1 ASV with an empty sequence"),
    Case("fasta-all-ambiguous", hashed(lambda i, s: _fasta(i, ["N" * 140, "RYN" * 40, *s[2:]])),
         (*DATA_DIR, "--sequences", "{d}/seqs.fasta"), 2, "2 ASV sequences made only of ambiguous bases"),
    Case("fasta-aligned-gaps", hashed(lambda i, s: _fasta(i, ["--" + x + ".." for x in s])),
         (*DATA_DIR, "--sequences", "{d}/seqs.fasta"), 2, "72 ASV sequences with alignment gaps"),
    Case("fasta-not-utf8", hashed(lambda i, s: _fasta(i, s).replace(f">{i[3]}", f">{i[3]} \udce9t\udce9", 1)),
         (*DATA_DIR, "--sequences", "{d}/seqs.fasta"), 2, "is not UTF-8 text: line 7, column 35 holds the byte 0xE9"),
    Case("fasta-missing-ids", hashed(lambda i, s: _fasta(i[:-2], s[:-2])),
         (*DATA_DIR, "--sequences", "{d}/seqs.fasta"), 2, "has no sequence for 2 of the 72 observation IDs"),
    Case("fasta-is-a-fifo", fasta_fifo, (*DATA_DIR, "--sequences", "{d}/pipe"), 2,
         "is a FIFO, not a regular file"),
    Case("hashed-ids-without-fasta", hashed(_fasta), DATA_DIR, 2, "look like hashes, not DNA"),
    Case("ids-with-gaps", renamed_ids(lambda s: s[:10] + "-" + s[10:]), DATA_DIR, 2, "(observation IDs): 72 ASV "
                                                                                     "sequences with alignment gaps"),
    Case("ids-not-dna", renamed_ids(lambda s: "OTU_" + hashlib.md5(s.encode()).hexdigest()[:6]), DATA_DIR, 2,
         "contain characters that are not DNA"),
    # files and folders
    Case("table-is-a-directory", table_is_dir, DATA_DIR, 2, "table.biom is a directory, not a file. It holds "
                                                            "'feature-table.biom'"),
    Case("table-symlink-loop", table_link_loop, DATA_DIR, 2, "table.biom is a symbolic link loop"),
    Case("table-symlink-loop-via-table", table_link_loop, ("--table", "{d}/table.biom"), 2, "symbolic link loop"),
    Case("truncated-hdf5", truncated("table.biom"), DATA_DIR, 2, "is a truncated HDF5 file"),
    Case("truncated-json", truncated("table.biom", "json", 0.8), DATA_DIR, 2, "the JSON ends early"),
    Case("biom-json-not-utf8", json_sample_renamed(b"caf\xe9"), DATA_DIR, 2,
         "table.biom (JSON) is not UTF-8 text: line 1, column"),
    Case("not-biom-at-all", lambda d, data: (good(d, data), (d / "table.biom").write_text("hello\n")), DATA_DIR, 2,
         "could not be read"),
    Case("two-tables", lambda d, data: (good(d, data), write_biom(data, d / "b.biom")), DATA_DIR, 2,
         "holds several BIOM tables (b.biom, table.biom)"),
    Case("data-dir-missing", nothing, ("--data-dir", "{d}/typo"), 2, "typo does not exist"),
    Case("data-dir-without-table", only("notes.txt", "tree.nwk"), DATA_DIR, 2,
         "holds no BIOM table (*.biom): it holds 'notes.txt', 'tree.nwk'"),
    Case("data-dir-with-qza", only("table.qza"), DATA_DIR, 2, "must be exported first"),
    Case("config-data-dir-missing", config_with_missing_data_dir, ("--config", "{d}/job.toml"), 2,
         "--data-dir no-such-folder does not exist"),
    Case("sequences-without-table", hashed(_fasta), ("--sequences", "{d}/seqs.fasta"), 2,
         "seqs.fasta was given but no BIOM table"),
    Case("synthetic-too-large", nothing, ("--token-limit", "100000000"), 2,  # the model's memory is checked first
         "--token-limit 100000000: the built-in model would hold at least"),
    # accepted with a NOTICE
    Case("fractional-counts-accepted", with_counts(lambda c: c / 7), (*DATA_DIR, *ONE_SMALL_STEP), 0,
         "NOTICE: BIOM table {d}/table.biom holds fractional counts"),
    Case("a-few-tips-without-length", with_tree(_some_lengths_missing), (*DATA_DIR, *ONE_SMALL_STEP), 0,
         "3 of its 142 branches have no length"),
    Case("empty-samples-dropped", with_counts(lambda c: np.where(np.isin(np.arange(24), [0, 5])[:, None], 0, c)),
         (*DATA_DIR, *ONE_SMALL_STEP), 0,
         "NOTICE: 2 of 24 samples of {d}/table.biom have no reads and were dropped: 'S1', 'S6'"),
    # Click refuses these before the job starts; the cli still writes the error report
    Case("table-flag-is-a-directory", table_is_dir, ("--table", "{d}/table.biom"), 2, "is a directory"),
    Case("click-bad-integer", nothing, ("--token-limit", "many"), 2, "'many' is not a valid integer"),
    # an output over an input: refused before anything is written (the report goes to the run_cli's own path)
    Case("log-over-the-table", good, (*DATA_DIR, "--log", "{d}/table.biom"), 2,
         "--log {d}/table.biom is the same file as the --data-dir file table.biom"),
    Case("plot-over-the-tree", good, ("--table", "{d}/table.biom", "--tree", "{d}/tree.nwk", "--plot", "{d}/tree.nwk"),
         2, "--plot {d}/tree.nwk is the same file as the --tree {d}/tree.nwk"),
]


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in CASES])
def test_bad_data(case: Case, run_cli, tiny_data, tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    case.write(d, copy.copy(tiny_data))
    before = fingerprint(d)
    args = [a.replace("{d}", str(d)) for a in case.args]
    config = [] if "--config" in args else ["--config", TINY]
    run = run_cli(*config, "--device", "cpu", *args)
    assert run.code == case.code, run.output
    assert case.message.replace("{d}", str(d)) in run.output, run.output
    assert "Traceback" not in run.output
    assert fingerprint(d) == before  # no input was written, moved or deleted
    assert run.report is not None, "no --report written"
    assert run.report["exit_code"] == case.code
    assert run.report["status"] == ("error" if case.code == 2 else "clean")
    if case.code == 2:
        assert run.output.count("debug-nan: error:") == 1
