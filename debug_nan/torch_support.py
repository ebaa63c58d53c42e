"""The Python and torch versions debug-nan works with, checked at start, and every place where torch's behaviour
differs between them: each difference is one named function or constant here, with the versions and the reason,
and the code that depends on it asks here instead of testing torch's version itself.

debug-nan runs inside the user's own interpreter beside the user's own torch (on a GPU node pinned by the CUDA
driver), so the range is what the CI matrix tests (scripts/test_matrix.sh, docs/support.md):

    Python 3.10-3.12: torch 2.4 and newer        Python 3.13: torch 2.5 and newer (2.4 has no 3.13 build)

Below the range the run would fail mid-way (an AttributeError inside a hook): `require()` stops it at start with
one line, what is supported and what was found (the CLI exits 2). Above the newest tested versions the run goes
on with one note. This module imports nothing from torch at import time (`import debug_nan` stays light) and
keeps to Python 3.8's syntax, so that an older Python gets the line, not a SyntaxError.
"""

import re
import sys

PYTHON_OLDEST = (3, 10)
PYTHON_NEWEST_TESTED = (3, 13)
TORCH_OLDEST = {(3, 10): (2, 4), (3, 11): (2, 4), (3, 12): (2, 4)}  # Python -> the oldest torch for it
TORCH_OLDEST_DEFAULT = (2, 5)  # Python 3.13 (torch 2.4 has no build for it) and newer
TORCH_NEWEST_TESTED = (2, 13)

RANGE = ("Python 3.10-3.13 with torch >= 2.4 (torch >= 2.5 on Python 3.13)")


class UnsupportedVersion(Exception):
    """Python or torch older than debug-nan supports (the CLI prints the message and exits 2: bad usage)."""

    exit_code = 2


def _dotted(version) -> str:
    return ".".join(str(v) for v in version)


def parse(version: str) -> tuple:
    """'2.4.1+cu121' -> (2, 4, 1); '2.6.0a0+git1234' -> (2, 6, 0): the release, without local or pre-release parts."""
    numbers = re.match(r"(\d+)\.(\d+)(?:\.(\d+))?", version)
    if numbers is None:
        return (0, 0, 0)
    return tuple(int(n or 0) for n in numbers.groups())


def oldest_torch(python=None) -> tuple:
    python = tuple((python or sys.version_info)[:2])
    return TORCH_OLDEST.get(python, TORCH_OLDEST_DEFAULT)


def python_problem(python=None) -> "str | None":
    """One line when this Python is older than supported, else None."""
    python = tuple((python or sys.version_info)[:3])
    if python[:2] < PYTHON_OLDEST:
        return "debug-nan supports {}; found Python {}.".format(RANGE, _dotted(python))
    return None


def torch_problem(torch_version: str, python=None) -> "str | None":
    """One line when this torch is older than supported on this Python, else None."""
    python = tuple((python or sys.version_info)[:3])
    oldest = oldest_torch(python)
    if parse(torch_version)[:2] < oldest:
        return ("debug-nan supports {}; found torch {} on Python {}: install torch >= {} (the range is in "
                "docs/support.md).".format(RANGE, torch_version, _dotted(python), _dotted(oldest)))
    return None


def untested(torch_version: str, python=None) -> "str | None":
    """One note when this Python or torch is newer than the newest tested (the run goes on), else None."""
    python = tuple((python or sys.version_info)[:3])
    newer = []
    if python[:2] > PYTHON_NEWEST_TESTED:
        newer.append("Python {}".format(_dotted(python)))
    if parse(torch_version)[:2] > TORCH_NEWEST_TESTED:
        newer.append("torch {}".format(torch_version))
    if not newer:
        return None
    return ("debug-nan: note: {} is newer than the newest tested (Python {}, torch {}): the run goes on; please "
            "report what differs.".format(" and ".join(newer), _dotted(PYTHON_NEWEST_TESTED),
                                          _dotted(TORCH_NEWEST_TESTED)))


_noted = []


def require(installed: bool = False) -> None:
    """At the start of every entry point (the CLI's commands, the Monitor, the framework callbacks): raise
    UnsupportedVersion (one line) for a Python or torch older than supported; a newer one than tested gets one
    note on stderr, once per process. Imports torch, unless `installed`: then the installed torch's version is read
    from its package metadata (the top process of `debug-nan run -- PROGRAM`, which never trains; nothing to check
    where torch is not installed beside it)."""
    problem = python_problem()
    if problem is not None:
        raise UnsupportedVersion(problem)
    if installed:
        from importlib import metadata

        try:
            version = metadata.version("torch")
        except metadata.PackageNotFoundError:
            return
    else:
        import torch

        version = torch.__version__
    problem = torch_problem(version)
    if problem is not None:
        raise UnsupportedVersion(problem)
    note = untested(version)
    if note is not None and not _noted:
        _noted.append(note)
        print(note, file=sys.stderr)


def torch_at_least(major: int, minor: int) -> bool:
    import torch

    return parse(torch.__version__)[:2] >= (major, minor)


# -- where torch's behaviour differs between the supported versions ------------------------------------------------

def ddp_without_buffer_broadcast() -> dict:
    """DistributedDataParallel's keyword that turns off its buffer broadcast in every forward. torch 2.4-2.x:
    `broadcast_buffers=False`; newer torch splits it and deprecates that spelling for `forward_sync_buffers`
    (engine/session/distributed.py wrap_ddp). Read from the signature: the split is what matters, not a version
    number."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    newer = "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
    return {"forward_sync_buffers": False} if newer else {"broadcast_buffers": False}


def torchrun_records_terminated_workers() -> bool:
    """Whether torchrun's failure summary lists the exit code of every worker, the ones it stopped included.

    When a worker exits non-zero, torchrun's agent (elastic/multiprocessing/api.py, SubprocessContext._poll, every
    --monitor-interval, 0.1 s) SIGTERMs the workers still running. Newer torch (pytorch/pytorch#160908, 2025:
    `_capture_process_failures`) then polls them again and lists their exit codes too; older torch (2.4 and 2.5
    seen here) lists only the workers that had already exited at the poll that saw the first failure. debug-nan's
    ranks leave together with the same code (engine/session/distributed.py leave_together: after a barrier, and
    torchrun's SIGTERM then exits with the rank's own code), so under an older torchrun the summary may name one
    rank where every rank exited with that code: the summary is torchrun's, and no worker can put in it a rank that
    the agent did not see exit. Read from torch's code, not from a version number."""
    from torch.distributed.elastic.multiprocessing.api import SubprocessContext

    return hasattr(SubprocessContext, "_capture_process_failures")


def _before_2_6_on_3_13(python=None, torch_version=None) -> bool:
    python = tuple((python or sys.version_info)[:2])
    if torch_version is None:
        import torch

        torch_version = torch.__version__
    return python >= (3, 13) and parse(torch_version)[:2] < (2, 6)


def save_options(python=None, torch_version=None) -> dict:
    """torch.save's keywords (the repro bundle: presentation/bundle.py). torch 2.5 on Python 3.13 cannot torch.save at
    all: it sets `persistent_id` on the C pickler, which Python 3.13 made read-only ("'_pickle.Pickler' object
    attribute 'persistent_id' is read-only"; torch 2.6 subclasses the pickler instead). There the file is written
    through the standard library's pure-Python pickler: the same format, read back by any torch.load."""
    if not _before_2_6_on_3_13(python, torch_version):
        return {}
    import pickle
    import types

    python_pickle = types.ModuleType("pickle_python_pickler")
    python_pickle.__dict__.update(pickle.__dict__)
    python_pickle.Pickler = pickle._Pickler  # a Python class: its persistent_id can be set
    return {"pickle_module": python_pickle}


def compile_supported(python=None, torch_version=None) -> bool:
    """Whether torch.compile works here: torch 2.5 on Python 3.13 raises "Dynamo is not supported on Python 3.13+"
    (torch 2.6 added it). debug-nan never compiles anything itself (its hooks only ask torch.compiler whether they
    are being traced, which works there): a script that compiles fails with torch's own error, as without debug-nan.
    The tests that compile skip there."""
    return not _before_2_6_on_3_13(python, torch_version)


__all__ = ["PYTHON_OLDEST", "RANGE", "TORCH_NEWEST_TESTED", "UnsupportedVersion", "compile_supported",
           "ddp_without_buffer_broadcast", "save_options",
           "oldest_torch", "parse", "python_problem", "require", "torch_at_least", "torch_problem",
           "torchrun_records_terminated_workers", "untested"]
