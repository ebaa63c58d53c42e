"""Load a BIOM table, a Newick tree and (for hashed IDs) a FASTA, and check that they agree.

Every problem becomes an InputError that names the file and what is wrong; input files are only ever read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import scipy.sparse as sp

from debug_nan.data.tokens import TokenReport, looks_like_hash, tokenize
from debug_nan.errors import InputError

TREE_SUFFIXES = (".nwk", ".tre", ".tree", ".newick")


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


def find_data_files(data_dir: str | Path) -> tuple[Path | None, Path | None]:
    """The single *.biom and the single Newick tree in data_dir (None where absent)."""
    data_dir = Path(data_dir)
    if not data_dir.exists():
        return None, None
    if not data_dir.is_dir():
        raise InputError(f"--data-dir {data_dir} is not a directory.")
    tables = sorted(p for p in data_dir.iterdir() if p.suffix.lower() == ".biom")
    trees = sorted(p for p in data_dir.iterdir() if p.suffix.lower() in TREE_SUFFIXES)
    for kind, found, flag in (("BIOM tables", tables, "--table"), ("trees", trees, "--tree")):
        if len(found) > 1:
            names = ", ".join(p.name for p in found)
            raise InputError(f"{data_dir} holds several {kind} ({names}); choose one with {flag} FILE.")
    return (tables[0] if tables else None), (trees[0] if trees else None)


def load_biom(path: str | Path):
    """Read a BIOM table (HDF5 or JSON) with biom-format."""
    import biom

    path = Path(path)
    if not path.is_file():
        raise InputError(f"BIOM table {path} does not exist.")
    try:
        table = biom.load_table(str(path))
    except Exception as exc:  # biom raises many kinds of errors for corrupt files
        raise InputError(
            f"BIOM table {path} could not be read ({type(exc).__name__}: {exc}). It must be a BIOM 1.0 (JSON) or "
            f"2.x (HDF5) file, e.g. written by `biom convert` or QIIME 2's `qiime tools export`."
        ) from None
    if table.shape[0] == 0 or table.shape[1] == 0 or table.sum() == 0:
        head = path.read_bytes()[:8]
        if not (head.startswith(b"\x89HDF") or head.lstrip().startswith(b"{")):
            raise InputError(f"BIOM table {path} could not be read: it is neither a BIOM 2.x (HDF5) nor a BIOM 1.0 "
                             f"(JSON) file, and parsed as a table with no data.")
        raise InputError(f"BIOM table {path} is empty ({table.shape[0]} observations x {table.shape[1]} samples, "
                         f"total count {table.sum():g}); there is nothing to train on.")
    return table


def load_tree(path: str | Path):
    """Read a Newick tree with scikit-bio."""
    import skbio

    path = Path(path)
    if not path.is_file():
        raise InputError(f"Tree {path} does not exist.")
    try:
        tree = skbio.TreeNode.read(str(path), format="newick")
    except Exception as exc:
        raise InputError(f"Tree {path} is not a readable Newick tree ({type(exc).__name__}: {exc}).") from None
    if tree.count(tips=True) == 0:
        raise InputError(f"Tree {path} has no tips.")
    return tree


def read_fasta(path: str | Path) -> dict[str, str]:
    """FASTA -> {id: sequence}; the id is the header up to the first whitespace."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"FASTA {path} (given with --sequences) does not exist.")
    out: dict[str, str] = {}
    name, chunks = None, []
    with path.open() as handle:
        for line in handle:
            line = line.strip()
            if line.startswith(">"):
                if name is not None:
                    out[name] = "".join(chunks)
                parts = line[1:].split()
                name, chunks = (parts[0] if parts else ""), []
            elif line:
                if name is None:
                    raise InputError(f"FASTA {path} does not start with a '>' header line.")
                chunks.append(line)
    if name is not None:
        out[name] = "".join(chunks)
    if not out:
        raise InputError(f"FASTA {path} holds no sequences.")
    return out


def _examples(items, n: int = 3) -> str:
    items = list(items)
    shown = ", ".join(repr(i[:40] + "..." if len(i) > 40 else i) for i in items[:n])
    return shown + (f" and {len(items) - n} more" if len(items) > n else "")


def resolve_sequences(asv_ids: list[str], table_path: Path, fasta_path: str | None) -> list[str]:
    """DNA for each observation ID: the ID itself, or the FASTA entry when the IDs are hashes."""
    if fasta_path:
        mapping = read_fasta(fasta_path)
        missing = [i for i in asv_ids if i not in mapping]
        if missing:
            raise InputError(f"FASTA {fasta_path} has no sequence for {len(missing)} of the {len(asv_ids)} "
                             f"observation IDs of {table_path}, e.g. {_examples(missing)}.")
        return [mapping[i] for i in asv_ids]
    hashed = [i for i in asv_ids if looks_like_hash(i)]
    if hashed:
        raise InputError(
            f"The observation IDs of {table_path} look like hashes, not DNA ({len(hashed)} of {len(asv_ids)}, e.g. "
            f"{_examples(hashed)}). Pass the sequences with --sequences FASTA (e.g. QIIME 2's dna-sequences.fasta)."
        )
    return list(asv_ids)


def check_tree_covers(tree, asv_ids: list[str], tree_path: Path, table_path: Path):
    """The tree must have a tip for every observation ID; returns the tree sheared to those tips."""
    tips = {t.name for t in tree.tips()}
    missing = [i for i in asv_ids if i not in tips]
    if missing:
        raise InputError(
            f"Tree {tree_path} has no tip for {len(missing)} of the {len(asv_ids)} observation IDs of "
            f"{table_path}, e.g. {_examples(missing)}. UniFrac needs every ASV on the tree: use the tree built from "
            f"this table's sequences (e.g. QIIME 2 `phylogeny align-to-tree-mafft-fasttree`) or filter the table."
        )
    if len(tips) > len(asv_ids):
        tree = tree.shear(asv_ids)
        tree.prune()
    return tree


def rarefy(table, depth: int, seed: int, table_path: Path):
    """Subsample every sample to `depth` reads (biom-format); samples with fewer reads are dropped."""
    before = table.shape[1]
    rare = table.subsample(depth, axis="sample", seed=seed)
    rare = rare.filter(lambda v, i, md: v.sum() > 0, axis="observation", inplace=False)
    if rare.shape[1] == 0:
        raise InputError(f"Every sample of {table_path} is empty after rarefaction to --rarefy-depth {depth} "
                         f"(the largest sample has {int(table.sum(axis='sample').max())} reads); lower the depth.")
    return rare, before - rare.shape[1]


def load_dataset(table_path: Path, tree_path: Path | None, fasta: str | None, rarefy_depth: int | None,
                 seed: int) -> Dataset:
    """BIOM + tree (+ FASTA) -> Dataset, with every cross-file check."""
    table = load_biom(table_path)
    if tree_path is None:
        raise InputError(f"Found BIOM table {table_path} but no Newick tree (*.nwk, *.tre, *.tree, *.newick) "
                         f"beside it; UniFrac targets need one: pass --tree FILE.")
    notes = [f"Loaded BIOM table {table_path}: {table.shape[1]} samples x {table.shape[0]} ASVs."]
    if rarefy_depth:
        table, dropped = rarefy(table, rarefy_depth, seed, table_path)
        notes.append(f"Rarefied to {rarefy_depth} reads per sample: {dropped} samples with fewer reads dropped, "
                     f"{table.shape[1]} kept, {table.shape[0]} ASVs left.")
    asv_ids = [str(i) for i in table.ids(axis="observation")]
    sample_ids = [str(i) for i in table.ids(axis="sample")]
    sequences = resolve_sequences(asv_ids, table_path, fasta)
    tokens, report = tokenize(sequences, asv_ids)
    if report.n_invalid:
        shown = "; ".join(f"{i[:30]!r} has {c!r}" for i, c in report.invalid_examples[:3])
        raise InputError(
            f"{report.n_invalid} ASV sequences of {fasta or table_path} contain characters that are not DNA "
            f"(A, C, G, T/U or IUPAC codes), e.g. {shown}. Observation IDs must be the ASV sequences, or pass "
            f"--sequences FASTA to map them."
        )
    tree = check_tree_covers(load_tree(tree_path), asv_ids, tree_path, table_path)
    notes.append(f"Loaded tree {tree_path}: {tree.count(tips=True)} tips cover all ASVs.")
    counts = sp.csr_matrix(table.matrix_data.T.astype(np.float64))  # [S, N]
    empty = np.flatnonzero(np.diff(counts.indptr) == 0)
    if empty.size:
        notes.append(f"{empty.size} samples have no reads and will be all-padding: "
                     f"{_examples([sample_ids[i] for i in empty])}.")
    return Dataset(sample_ids=sample_ids, asv_ids=asv_ids, sequences=sequences, counts=counts, tokens=tokens,
                   tree=tree, source=str(table_path), token_report=report, notes=notes)
