"""Read the input files (BIOM table, Newick tree, FASTA) and say exactly what is wrong when one cannot be read.

Every failure is an InputError naming the file and the problem: a directory or a symbolic-link loop where a file
was expected, a truncated HDF5 or JSON table, a Newick string cut short, a byte that is not UTF-8 (with its
line). The files are only ever opened for reading.
"""

from __future__ import annotations

import errno
import io
import json
import os
import re
import stat
import warnings
from pathlib import Path

from debug_nan.aam.data.validation import check_counts, check_unique_ids, counted, some
from debug_nan.errors import InputError

HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"
_JSON_NONFINITE = re.compile(r"(?<=[\[,\s])-?(nan|inf)(?=\s*[\],])", re.IGNORECASE)


def check_input_file(path: str | Path, what: str, option: str = "") -> Path:
    """A regular, readable file, else an InputError saying what the path is instead (what: e.g. 'BIOM table';
    option: the flag that named it, e.g. '--sequences')."""
    path = Path(path)
    what = f"{what} {path}" + (f" (given with {option})" if option else "")
    try:
        mode = path.stat().st_mode
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise InputError(f"{what} is a symbolic link loop (it points back at itself through "
                             f"{os.readlink(path) if path.is_symlink() else 'a link in its path'}); point it at the "
                             f"real file.") from None
        if path.is_symlink():
            raise InputError(f"{what} is a symbolic link to {os.readlink(path)}, which does not exist.") from None
        if exc.errno in (errno.ENOENT, errno.ENOTDIR):
            raise InputError(f"{what} does not exist.") from None
        raise InputError(f"{what} cannot be read ({exc.strerror or exc}).") from None
    if stat.S_ISDIR(mode):
        inside = (sorted(p.name for p in path.iterdir() if p.suffix.lower() == ".biom")[:3]
                  if os.access(path, os.R_OK) else [])
        hint = f" It holds {some(inside)}: pass that file." if inside else " Pass the file itself."
        raise InputError(f"{what} is a directory, not a file.{hint}")
    if not stat.S_ISREG(mode):
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a socket" if stat.S_ISSOCK(mode) else "a device"
        raise InputError(f"{what} is {kind}, not a regular file; copy the data into a file first.")
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise InputError(f"{what} cannot be read ({exc.strerror or exc}).") from None
    return path


def read_text(path: Path, what: str) -> str:
    """The file as UTF-8 text (a byte-order mark is allowed); a byte that is not UTF-8 is named with its line."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputError(_not_utf8(f"{what} {path}", data, exc)) from None


def _not_utf8(what: str, data: bytes, exc: UnicodeDecodeError) -> str:
    line = data.count(b"\n", 0, exc.start) + 1
    column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
    return (f"{what} is not UTF-8 text: line {line}, column {column} holds the byte 0x{data[exc.start]:02X} "
            f"({exc.reason}). It is a plain-text format; fix that line (often a name typed in another encoding, "
            f"e.g. Latin-1) or export the file again.")


# --- BIOM -----------------------------------------------------------------------------------------------------------

def load_biom(path: str | Path):
    """Read a BIOM table (HDF5 or JSON) with biom-format."""
    import biom

    path = check_input_file(path, "BIOM table")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            table = biom.load_table(str(path))
    except Exception as exc:  # noqa: BLE001 - biom raises many kinds of errors for corrupt files
        raise InputError(_biom_failure(path, exc)) from None
    if table.shape[0] == 0 or table.shape[1] == 0:
        head = path.read_bytes()[:8]
        if not (head.startswith(HDF5_SIGNATURE) or head.lstrip().startswith(b"{")):
            raise InputError(f"BIOM table {path} could not be read: it is neither a BIOM 2.x (HDF5) nor a BIOM 1.0 "
                             f"(JSON) file, and parsed as a table with no data.")
    return table


def _biom_failure(path: Path, exc: Exception) -> str:
    """One paragraph saying why biom-format could not read `path` (raises for duplicate IDs and bad counts)."""
    data = path.read_bytes()
    prefix = f"BIOM table {path} could not be read"
    formats = ("It must be a BIOM 1.0 (JSON) or 2.x (HDF5) file, e.g. written by `biom convert` or QIIME 2's "
               "`qiime tools export`.")
    if "Duplicate" in str(exc):  # biom's TableException for a repeated sample or observation ID
        _raise_duplicate_ids(path, data)
    if not data:
        return f"{prefix}: the file is empty (0 bytes). {formats}"
    if data.startswith(HDF5_SIGNATURE):
        sizes = re.search(r"eof = (\d+).*stored_eof = (\d+)", str(exc))
        if sizes:
            return (f"{prefix}: it is a truncated HDF5 file ({int(sizes.group(1)):,} of the {int(sizes.group(2)):,} "
                    f"bytes its header announces); the copy or download was cut short: copy it again.")
        if isinstance(exc, KeyError):
            return (f"{prefix}: it is an HDF5 file but not a BIOM table (no {exc.args[0]!r}); {formats}")
        return f"{prefix}: it is a damaged HDF5 file ({type(exc).__name__}: {exc}). {formats}"
    if data.lstrip().startswith(b"{"):
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as bad:
            return _not_utf8(f"BIOM table {path} (JSON)", data, bad)
        text = data.decode("utf-8")
        if isinstance(exc, json.JSONDecodeError):
            if _JSON_NONFINITE.search(text):
                _raise_json_counts(path, text)
            where = f"line {exc.lineno}, column {exc.colno}: {exc.msg}"
            if not text.rstrip().endswith("}"):
                return f"{prefix}: the JSON ends early ({where}); the file is truncated: copy or export it again."
            return f"{prefix}: it is not valid JSON ({where}). {formats}"
        return f"{prefix}: it is JSON but not a BIOM 1.0 table ({type(exc).__name__}: {exc}). {formats}"
    return f"{prefix} ({type(exc).__name__}: {exc}). {formats}"


def _tolerant_json(text: str) -> dict | None:
    """BIOM JSON as biom-format writes it, where a NaN/Inf count is the bare word nan/inf (not JSON)."""
    fixed = _JSON_NONFINITE.sub(lambda m: "NaN" if m.group(1).lower() == "nan" else
                                m.group(0)[:-3] + "Infinity", text)
    try:
        return json.loads(fixed)
    except ValueError:
        return None


def _raise_json_counts(path: Path, text: str) -> None:
    """A JSON table that holds nan/inf: name the samples and ASVs, as for an HDF5 table."""
    import biom

    parsed = _tolerant_json(text)
    if parsed is None:
        return
    try:
        table = biom.Table.from_json(parsed)
    except Exception:  # noqa: BLE001 - a closer look only: the table's own error is said anyway
        return
    import scipy.sparse as sp

    check_counts(sp.csr_matrix(table.matrix_data.T), [str(i) for i in table.ids()],
                 [str(i) for i in table.ids(axis="observation")], path)


def _raise_duplicate_ids(path: Path, data: bytes) -> None:
    ids = {}
    try:
        if data.startswith(HDF5_SIGNATURE):
            import h5py

            with h5py.File(path, "r") as handle:
                for axis in ("sample", "observation"):
                    ids[axis] = [i.decode() if isinstance(i, bytes) else str(i) for i in handle[f"{axis}/ids"][:]]
        else:
            parsed = _tolerant_json(data.decode("utf-8", "replace")) or {}
            ids["sample"] = [str(c.get("id")) for c in parsed.get("columns", [])]
            ids["observation"] = [str(r.get("id")) for r in parsed.get("rows", [])]
    except Exception:  # noqa: BLE001 - a closer look only: the table's own error is said anyway
        return
    for axis, fix in (("sample", "merge them (`qiime feature-table merge`, `biom` collapse) or rename them."),
                      ("observation", "merge those features (e.g. sum their counts) or rename them.")):
        check_unique_ids(ids.get(axis, []), f"{axis} ID", f"BIOM table {path}", fix)


# --- Newick ---------------------------------------------------------------------------------------------------------

def load_tree(path: str | Path):
    """Read a Newick tree with scikit-bio."""
    import skbio

    path = check_input_file(path, "Tree")
    text = read_text(path, "Tree")
    if not text.strip():
        raise InputError(f"Tree {path} is empty (no Newick string).")
    try:
        with warnings.catch_warnings():  # scikit-bio warns about the format before it raises; we explain instead
            warnings.simplefilter("ignore")
            tree = skbio.TreeNode.read(io.StringIO(text), format="newick")
    except Exception as exc:  # noqa: BLE001 - scikit-bio raises many kinds of errors for a bad tree
        raise InputError(f"Tree {path} is not a readable Newick tree: {_newick_problem(text, exc)}") from None
    if tree.count(tips=True) == 0:
        raise InputError(f"Tree {path} has no tips.")
    return tree


def _newick_problem(text: str, exc: Exception) -> str:
    body = text.strip()
    opens, closes = body.count("("), body.count(")")
    if not body.endswith(";"):
        return (f"it does not end with ';' ({opens} '(' and {closes} ')', the last characters are {body[-30:]!r}), "
                f"so the file looks truncated: copy or export it again.")
    if opens != closes:
        return f"its parentheses do not balance ({opens} '(' but {closes} ')')."
    return f"{type(exc).__name__}: {exc}"


# --- FASTA ----------------------------------------------------------------------------------------------------------

def read_fasta(path: str | Path) -> dict[str, str]:
    """FASTA -> {id: sequence}; the id is the header up to the first whitespace. IDs must be unique."""
    path = check_input_file(path, "FASTA", "--sequences")
    text = read_text(path, "FASTA")
    chunks: dict[str, list[str]] = {}
    header_line: dict[str, int] = {}
    repeated: dict[str, list[int]] = {}
    name = None
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if line.startswith(">"):
            parts = line[1:].split()
            if not parts:
                raise InputError(f"FASTA {path}, line {number}: a '>' header without an ID.")
            name = parts[0]
            if name in chunks:
                repeated.setdefault(name, [header_line[name]]).append(number)
                continue
            chunks[name], header_line[name] = [], number
        elif line:
            if name is None:
                raise InputError(f"FASTA {path} does not start with a '>' header line (line {number} is "
                                 f"{line[:30]!r}).")
            if name not in repeated:
                chunks[name].append(line)
    if repeated:
        shown = ", ".join(f"{i[:40]!r} (lines {', '.join(map(str, lines[:4]))})" for i, lines in
                          list(repeated.items())[:3])
        more = f" and {len(repeated) - 3} more" if len(repeated) > 3 else ""
        raise InputError(f"FASTA {path} has {counted(len(repeated), 'repeated ID')}: {shown}{more}. Each ID "
                         f"must name one sequence (QIIME 2 refuses such a file); remove the duplicate records.")
    if not chunks:
        raise InputError(f"FASTA {path} holds no sequences.")
    return {k: "".join(v) for k, v in chunks.items()}
