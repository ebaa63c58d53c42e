"""A costly run shared by several tests, made once per pytest session however many pytest-xdist workers ask.

A session fixture is per worker, and pytest-xdist's `--dist loadgroup` does not keep a group on one worker under
this pytest (checked: the three tests of one group ran on two workers, each making the run), so the first worker
to ask makes the run under a file lock in the session's shared temporary folder; the others wait and read it.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
from pathlib import Path
from typing import Callable


def once(tmp_path_factory, name: str, make: Callable[[Path], subprocess.CompletedProcess]) -> tuple[
        subprocess.CompletedProcess, Path]:
    """make(folder) -> its process, run once per session in a folder every worker sees -> (process, folder)."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):  # (each worker's base is a folder of the session's shared one)
        root = root.parent
    folder, record = root / name, root / f"{name}.json"
    with open(root / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not record.is_file():
            folder.mkdir(exist_ok=True)
            done = make(folder)
            record.write_text(json.dumps({"args": [str(a) for a in done.args], "returncode": done.returncode,
                                          "stdout": done.stdout, "stderr": done.stderr}))
    kept = json.loads(record.read_text())
    return subprocess.CompletedProcess(kept["args"], kept["returncode"], kept["stdout"], kept["stderr"]), folder
