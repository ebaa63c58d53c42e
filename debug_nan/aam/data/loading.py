"""Load a BIOM table, a Newick tree and (for hashed IDs) a FASTA, validate them as the field's tools do, and check
that they agree.

Every problem becomes an InputError that names the file and what is wrong (see validation.py for the rules);
input files are only ever read. The long steps log a line before and after, with their size and time.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from debug_nan.aam.data.progress import Phase, file_size
from debug_nan.aam.data.readers import check_input_file, load_biom, load_tree, read_fasta
from debug_nan.aam.data.tokens import TokenReport, looks_like_hash, tokenize
from debug_nan.aam.data.validation import check_counts, check_sequences, check_tree, check_tree_length, some
from debug_nan.errors import InputError

TREE_SUFFIXES = (".nwk", ".tre", ".tree", ".newick")
__all__ = ["Dataset", "find_data_files", "load_dataset", "load_biom", "load_tree", "read_fasta", "TREE_SUFFIXES"]


@dataclass
class Dataset:
    """Everything the AAM pipeline needs, samples x ASVs.

    counts: CSR [S, N] (samples x ASVs); tokens: uint8 [N, 151]; tree: skbio.TreeNode whose tips include all
    asv_ids; sequences: the DNA of each ASV (equal to asv_ids unless a FASTA mapped hashed IDs).
    """

    sample_ids: list[str]
    asv_ids: list[str]
    sequences: list[str]
    counts: sp.csr_matrix
    tokens: np.ndarray
    tree: object
    source: str
    token_report: TokenReport
    notes: list[str] = field(default_factory=list)

    @property
    def n_samples(self) -> int:
        return len(self.sample_ids)

    def richness(self) -> np.ndarray:
        """Number of ASVs with a non-zero count per sample, int [S]."""
        return np.diff(self.counts.indptr)


def _describe_folder(entries: list[Path]) -> str:
    if not entries:
        return "it is empty"
    names = sorted(p.name + ("/" if p.is_dir() else "") for p in entries)
    text = f"it holds {some(names, 5)}"
    if any(p.suffix.lower() == ".qza" for p in entries):
        text += ("; a QIIME 2 artifact (.qza) must be exported first: `qiime tools export --input-path table.qza "
                 "--output-path DIR` writes DIR/feature-table.biom")
    elif any(p.suffix.lower() in (".tsv", ".txt") for p in entries):
        text += "; a TSV table converts with `biom convert -i table.tsv -o table.biom --to-hdf5`"
    return text


def find_data_files(data_dir: str | Path, required: bool = False) -> tuple[Path | None, Path | None]:
    """The single *.biom and the single Newick tree in data_dir (None where absent).

    required: the folder was named explicitly (--data-dir), so a missing folder, or one without a *.biom, is an
    error; otherwise (the default ./data) it means "no data asked for" and the caller may synthesize."""
    data_dir = Path(data_dir)
    if not data_dir.is_dir():
        if os.path.lexists(data_dir):  # a file, a broken link or a link loop: never silently "no data"
            check_input_file(data_dir, "--data-dir")
            raise InputError(f"--data-dir {data_dir} is not a directory.")
        if required:
            where = "" if data_dir.is_absolute() else f" (relative to {Path.cwd()})"
            raise InputError(f"--data-dir {data_dir} does not exist{where}. Point --data-dir at "
                             f"the folder with your *.biom table and Newick tree, or pass --table/--tree; without "
                             f"--data-dir, ./data is used and data is synthesized when it has no table.")
        return None, None
    try:
        entries = list(data_dir.iterdir())
    except OSError as exc:
        raise InputError(f"--data-dir {data_dir} cannot be read ({exc.strerror or exc}).") from None
    tables = sorted(p for p in entries if p.suffix.lower() == ".biom")
    trees = sorted(p for p in entries if p.suffix.lower() in TREE_SUFFIXES)
    for kind, found, flag in (("BIOM tables", tables, "--table"), ("trees", trees, "--tree")):
        if len(found) > 1:
            names = ", ".join(p.name for p in found)
            raise InputError(f"{data_dir} holds several {kind} ({names}); choose one with {flag} FILE.")
    if required and not tables:
        raise InputError(f"--data-dir {data_dir} holds no BIOM table (*.biom): {_describe_folder(entries)}. Put the "
                         f"table (HDF5 or JSON) and its Newick tree there, or pass --table FILE --tree FILE.")
    return (tables[0] if tables else None), (trees[0] if trees else None)


def resolve_sequences(asv_ids: list[str], table_path: Path, fasta_path: str | None) -> list[str]:
    """DNA for each observation ID: the ID itself, or the FASTA entry when the IDs are hashes."""
    if fasta_path:
        mapping = read_fasta(fasta_path)
        missing = [i for i in asv_ids if i not in mapping]
        if missing:
            raise InputError(f"FASTA {fasta_path} has no sequence for {len(missing)} of the {len(asv_ids)} "
                             f"observation IDs of {table_path}, e.g. {some(missing)}.")
        return [mapping[i] for i in asv_ids]
    hashed = [i for i in asv_ids if looks_like_hash(i)]
    if hashed:
        raise InputError(
            f"The observation IDs of {table_path} look like hashes, not DNA ({len(hashed)} of {len(asv_ids)}, e.g. "
            f"{some(hashed)}). Pass the sequences with --sequences FASTA (e.g. QIIME 2's dna-sequences.fasta)."
        )
    return list(asv_ids)


def check_tree_covers(tree, asv_ids: list[str], tree_path: Path, table_path: Path):
    """The tree must have a tip for every observation ID; returns the tree sheared to those tips."""
    tips = {t.name for t in tree.tips()}
    missing = [i for i in asv_ids if i not in tips]
    if missing:
        raise InputError(
            f"Tree {tree_path} has no tip for {len(missing)} of the {len(asv_ids)} observation IDs of "
            f"{table_path}, e.g. {some(missing)}. UniFrac needs every ASV on the tree: use the tree built from "
            f"this table's sequences (e.g. QIIME 2 `phylogeny align-to-tree-mafft-fasttree`) or filter the table."
        )
    if len(tips) > len(asv_ids):
        tree = tree.shear(asv_ids)
        tree.prune()
    return tree


def drop_empty(table, table_path: Path):
    """Drop samples without reads, then ASVs without reads, as QIIME 2 and AAM do (a NOTICE for each)."""
    notes = []
    sums = table.sum(axis="sample")
    if table.shape[0] == 0 or table.shape[1] == 0 or not np.any(sums > 0):
        raise InputError(f"BIOM table {table_path} is empty ({table.shape[0]} observations x {table.shape[1]} "
                         f"samples, total count {float(np.sum(sums)):g}); there is nothing to train on.")
    empty = [str(i) for i, s in zip(table.ids(axis="sample"), sums) if s == 0]
    if empty:
        table = table.filter(lambda v, i, md: v.sum() > 0, axis="sample", inplace=False)
        notes.append(f"NOTICE: {len(empty)} of {len(sums)} samples of {table_path} have no reads and were dropped: "
                     f"{some(empty)}. QIIME 2 and AAM do the same (rarefying drops them, as does `qiime "
                     f"feature-table filter-samples --p-min-frequency 1`): an empty sample has no ASV to attend "
                     f"over and no UniFrac distance to learn.")
    asv_sums = table.sum(axis="observation")
    unused = [str(i) for i, s in zip(table.ids(axis="observation"), asv_sums) if s == 0]
    if unused:
        table = table.filter(lambda v, i, md: v.sum() > 0, axis="observation", inplace=False)
        notes.append(f"NOTICE: {len(unused)} of {len(asv_sums)} ASVs of {table_path} have no reads in any sample "
                     f"and were dropped (as `qiime feature-table filter-features --p-min-frequency 1` does): "
                     f"{some(unused)}.")
    return table, notes


def rarefy(table, depth: int, seed: int, table_path: Path):
    """Subsample every sample to `depth` reads (biom-format); samples with fewer reads are dropped."""
    before = table.shape[1]
    rare = table.subsample(depth, axis="sample", seed=seed)
    rare = rare.filter(lambda v, i, md: v.sum() > 0, axis="observation", inplace=False)
    if rare.shape[1] == 0:
        raise InputError(f"Every sample of {table_path} is empty after rarefaction to --rarefy-depth {depth} "
                         f"(the largest sample has {int(table.sum(axis='sample').max())} reads); lower the depth.")
    return rare, before - rare.shape[1]


def _counts(table) -> tuple[sp.csr_matrix, list[str], list[str]]:
    """CSR [S, N] float64 counts, sample IDs, ASV IDs."""
    counts = sp.csr_matrix(table.matrix_data.T.astype(np.float64))
    return counts, [str(i) for i in table.ids(axis="sample")], [str(i) for i in table.ids(axis="observation")]


def load_dataset(table_path: Path, tree_path: Path | None, fasta: str | None, rarefy_depth: int | None,
                 seed: int, log=None) -> Dataset:
    """BIOM + tree (+ FASTA) -> Dataset, with every check; `log` gets a line before and after each long step."""
    table_path = check_input_file(table_path, "BIOM table")
    if tree_path is None:
        raise InputError(f"Found BIOM table {table_path} but no Newick tree (*.nwk, *.tre, *.tree, *.newick) "
                         f"beside it; UniFrac targets need one: pass --tree FILE.")
    with Phase(log, f"Reading BIOM table {table_path} ({file_size(table_path)})") as phase:
        table = load_biom(table_path)
        counts, sample_ids, asv_ids = _counts(table)
        phase.done(f"Loaded BIOM table {table_path}: {len(sample_ids)} samples x {len(asv_ids)} ASVs "
                   f"({counts.nnz:,} non-zero counts)")
    notes = check_counts(counts, sample_ids, asv_ids, table_path)
    table, dropped = drop_empty(table, table_path)
    notes += dropped
    if rarefy_depth:
        if counts.nnz and not np.all(counts.data == np.rint(counts.data)):
            raise InputError(f"--rarefy-depth {rarefy_depth} needs integer read counts, but BIOM table {table_path} "
                             f"holds fractional counts (a relative-frequency table); pass the raw feature table or "
                             f"leave out --rarefy-depth.")
        table, n_dropped = rarefy(table, rarefy_depth, seed, table_path)
        notes.append(f"Rarefied to {rarefy_depth} reads per sample: {n_dropped} samples with fewer reads dropped, "
                     f"{table.shape[1]} kept, {table.shape[0]} ASVs left.")
    counts, sample_ids, asv_ids = _counts(table)
    sequences = resolve_sequences(asv_ids, table_path, fasta)
    source = f"FASTA {fasta}" if fasta else f"BIOM table {table_path} (observation IDs)"
    with Phase(log, f"Tokenising {len(sequences):,} ASV sequences") as phase:
        tokens, report = tokenize(sequences, asv_ids)
        phase.done(f"Tokenised {len(sequences):,} ASV sequences into {tokens.shape[0]:,} x {tokens.shape[1]} tokens")
    if report.n_invalid:
        shown = "; ".join(f"{i[:30]!r} has {c!r}" for i, c in report.invalid_examples[:3])
        raise InputError(
            f"{report.n_invalid} ASV sequences of {fasta or table_path} contain characters that are not DNA "
            f"(A, C, G, T/U or IUPAC codes), e.g. {shown}. Observation IDs must be the ASV sequences, or pass "
            f"--sequences FASTA to map them."
        )
    check_sequences(asv_ids, sequences, source)
    tree_path = check_input_file(tree_path, "Tree")
    with Phase(log, f"Reading tree {tree_path} ({file_size(tree_path)})") as phase:
        tree = load_tree(tree_path)
        notes += check_tree(tree, tree_path)
        tree = check_tree_covers(tree, asv_ids, tree_path, table_path)
        check_tree_length(tree, tree_path, len(asv_ids))
        phase.done(f"Loaded tree {tree_path}: {tree.count(tips=True)} tips cover all {len(asv_ids)} ASVs")
    return Dataset(sample_ids=sample_ids, asv_ids=asv_ids, sequences=sequences, counts=counts, tokens=tokens,
                   tree=tree, source=str(table_path), token_report=report, notes=notes)
