"""Output files: every output path is checked against the inputs and the other outputs before anything is opened
for writing, and every output file is written atomically (a temporary file in the same folder, then os.replace),
so an interrupted or failed write never leaves a truncated file and never touches an input.

No torch here: the cli uses it before torch loads (usage errors, the error report).
"""

from __future__ import annotations

import fnmatch
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Callable, Mapping

from debug_nan.errors import InputError, describe_os_error

BUNDLE_PATTERN = "debug-nan-bundle-step*-micro*.pt"
DATA_SUFFIXES = (".biom", ".nwk", ".tre", ".tree", ".newick")  # what --data-dir's loader reads


class OutputWriteError(InputError):
    """An output could not be written at the end of a run (disk full, folder gone, read-only). The run's own
    outputs that could be written were; the cli prints the message and exits 2 without an error report over them."""


def _real(path: str | os.PathLike) -> str:
    return os.path.realpath(os.path.abspath(os.path.expanduser(str(path))))


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """The same file: the same real path (symlinks resolved), or two names of one existing file (hard links)."""
    if _real(a) == _real(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def task_file(spec: str | None) -> str | None:
    """The file of a --task FILE.py:NAME spec (None for a package.module:NAME spec)."""
    if not spec or ":" not in spec:
        return None
    where = spec.rsplit(":", 1)[0]
    return where if where.endswith(".py") or "/" in where or "\\" in where else None


def data_dir_files(folder: str | None) -> list[str]:
    """The files in --data-dir that its loader may read (tables and trees); none when it cannot be listed."""
    if not folder:
        return []
    try:
        return sorted(str(p) for p in Path(folder).iterdir() if p.suffix.lower() in DATA_SUFFIXES)
    except OSError:
        return []


def job_inputs(values: Mapping, config: str | None = None) -> dict[str, str]:
    """label -> path of every input of a run, from its settings (the CLI job's flat record, JobSettings.to_dict(),
    or the raw flags)."""
    inputs = {f"--{k}": values.get(k) for k in ("table", "tree", "sequences")}
    inputs["--config"] = config
    inputs["--task file"] = task_file(values.get("task"))
    if not values.get("table"):
        for path in data_dir_files(values.get("data_dir") or "./data"):
            inputs[f"--data-dir file {Path(path).name}"] = path
    return {label: str(path) for label, path in inputs.items() if path}


def rank_path(path: str, rank: int) -> str:
    """Another rank's own copy of an output, beside it: report.json -> report.rank1.json."""
    p = Path(path)
    return str(p.with_name(f"{p.stem}.rank{rank}{p.suffix}"))


def job_outputs(values: Mapping) -> dict[str, str]:
    return {f"--{k}": str(values[k]) for k in ("report", "log", "plot") if values.get(k)}


def check_output_paths(outputs: Mapping[str, str], inputs: Mapping[str, str], bundle_dir: str | None = None) -> None:
    """Exit 2 (InputError naming both) when an output path is an input path, another output path, or the name of
    a repro bundle a finding would write into `bundle_dir`. Real paths are compared (symlinks and hard links)."""
    outs = [(k, v) for k, v in outputs.items() if v]
    for i, (option, path) in enumerate(outs):
        for label, source in inputs.items():
            if same_file(path, source):
                raise InputError(f"{option} {path} is the same file as the {label} {source}: debug-nan never "
                                 f"writes over an input. Give {option} another path.")
        for other, path2 in outs[i + 1:]:
            if same_file(path, path2):
                raise InputError(f"{option} {path} and {other} {path2} are the same file: give each output its "
                                 f"own path.")
    if bundle_dir is None:
        return
    folder = _real(bundle_dir)
    for label, path in [*inputs.items(), *outs]:
        real = _real(path)
        if os.path.dirname(real) == folder and fnmatch.fnmatch(os.path.basename(real), BUNDLE_PATTERN):
            raise InputError(f"{label} {path} has the name of a repro bundle that a finding writes into {bundle_dir} "
                             f"(--bundle-dir): rename it, or give --bundle-dir another folder (or --no-bundle).")


def check_writable(path: str | None, option: str) -> None:
    """Fail early (exit 2) when an output path cannot be written, before any training time is spent. An existing
    file there stays as it is until the run replaces it."""
    if not path:
        return
    p = Path(path)
    target = Path(_real(p))
    try:
        mode = target.stat().st_mode
    except FileNotFoundError:
        mode = None
    except OSError as exc:  # a name over 255 bytes, a file where a folder should be
        raise InputError(f"{option} {p}: cannot write there ({describe_os_error(exc)}).") from None
    if mode is not None and stat.S_ISDIR(mode):
        raise InputError(f"{option} {p} is a directory; give a file path.")
    if mode is not None:
        if not stat.S_ISREG(mode):
            raise InputError(f"{option} {p} is not a regular file (a device, FIFO or socket); give a file path.")
        if not mode & 0o222:
            raise InputError(f"{option} {p} exists and is read-only: debug-nan does not replace it. Make it "
                             f"writable (chmod u+w) or give another path.")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target.parent, prefix=".debug-nan-probe-"):
            pass  # probe the folder
    except OSError as exc:
        raise InputError(f"{option} {p}: cannot write there ({describe_os_error(exc)}).") from None


def atomic_write(path: str | os.PathLike, write: Callable, option: str) -> None:
    """Write a file atomically: `write(binary_file)` fills a temporary file in the target's folder, which then
    replaces the target (a symlink's target, the link kept). The new file gets the old one's permissions, or the
    umask's. Any failure -> OutputWriteError naming the option and the reason; the old file stays untouched."""
    target = Path(_real(path))
    tmp = None
    try:
        # the temporary name fits the 255-byte limit whatever the target's (legal) name: ".NAME[:200].XXXXXXXX.partial"
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name[:200]}.", suffix=".partial")
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        try:
            mode = stat.S_IMODE(target.stat().st_mode)
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        os.chmod(tmp, mode)
        os.replace(tmp, target)
        tmp = None
    except Exception as exc:  # noqa: BLE001 - torch.save reports a full disk as a RuntimeError
        raise OutputWriteError(f"{option} {path}: could not be written ({_reason(exc, target)}); nothing was "
                               f"left half-written there.") from None
    finally:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass


def _reason(exc: Exception, target: Path) -> str:
    """Why a write failed, in words: torch's writer says "[enforce fail at inline_container.cc]" for a full disk."""
    if not target.parent.is_dir():
        return f"its folder {target.parent} does not exist (any more)"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    try:
        if shutil.disk_usage(target.parent).free < 1 << 20:
            return f"no space left on the device of {target.parent}"
    except OSError:
        pass
    first = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {first}" if first else type(exc).__name__


def write_text_atomic(path: str | os.PathLike, text: str, option: str) -> None:
    atomic_write(path, lambda handle: handle.write(text.encode("utf-8")), option)
