"""The private folder of one `debug-nan run -- PROGRAM`: the start-up hook every Python process of the command loads
(`hook/sitecustomize.py`, a copy of process/startup_hook.py) and the results its watched processes leave
(`results/<pid>.json`, one per process that trained: its rank, how it ended, its report), and what a launcher said
of the workers that failed (`launcher/<pid>.json`: torchrun's ChildFailedError, a killed rank's signal). Made in the
system's temporary folder and removed when the run ends: nothing is installed or left behind.

A result, as a watched process writes it (atomically: a reader never sees half of one):
  {"rank": 1, "world": 2, "pid": 4242, "ending": "trip" | "max-steps" | "error" | "ended" | "refused", "code": 0,
   "code_seen": true,  # false: the process saw no sys.exit (its end, or a SystemExit it raised itself)
   "node_ranks": [0, 1] | null,  # the global ranks of its torchrun node (RANK - LOCAL_RANK, LOCAL_WORLD_SIZE)
   "report": {... the report of that process, as `debug-nan run`'s report, its history included ...},
   "layout": [[module path, type, [its parameters]], ...],  # (the top's history table, plot, TensorBoard)
   "held": "its debug-nan lines"}
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

from debug_nan.process import startup_hook

OPTIONS = "DEBUG_NAN_RUN_OPTIONS"  # the run's options (RunOptions as JSON), for the watched processes
REFUSED = "refused"  # a result's `ending`: a forked child that trained, refused (app/run_fork.py; its code: 2)


class RunFolder:
    def __init__(self, path: str | None = None):
        self.path = Path(path or tempfile.mkdtemp(prefix="debug-nan-run-"))
        self.hook = self.path / "hook"
        self.results_dir = self.path / "results"

    def make(self) -> RunFolder:
        self.hook.mkdir(parents=True, exist_ok=True)
        self.results_dir.mkdir(exist_ok=True)
        shutil.copyfile(startup_hook.__file__, self.hook / "sitecustomize.py")
        return self

    def environment(self, options, base: dict | None = None) -> dict:
        """The command's environment: the hook first on PYTHONPATH, the folder and the options named."""
        env = dict(os.environ if base is None else base)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.hook), env.get("PYTHONPATH", "")) if p)
        env[startup_hook.RUN_DIR] = str(self.path)
        env[OPTIONS] = json.dumps(asdict(options))
        return env

    @contextmanager
    def exported(self, options):
        """While a Python command runs in this process: the processes it starts (torch.multiprocessing.spawn's
        workers, Lightning's ranks) get the hook through this process's environment, as a program's do."""
        keys = ("PYTHONPATH", startup_hook.RUN_DIR, OPTIONS)
        saved = {k: os.environ.get(k) for k in keys}
        os.environ.update({k: v for k, v in self.environment(options).items() if k in keys})
        try:
            yield self
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def write_result(self, result: dict) -> None:
        final = self.results_dir / f"{os.getpid()}.json"
        part = final.with_suffix(".part")
        part.write_text(json.dumps(result, default=str))  # (NaN as Python reads it back)
        os.replace(part, final)

    def results(self) -> list[dict]:
        """Every watched process's result, by rank (then by pid: processes that share no process group)."""
        found = []
        for path in sorted(self.results_dir.glob("*.json")):
            try:
                found.append(json.loads(path.read_text()))
            except (OSError, ValueError):
                continue
        return sorted(found, key=lambda r: (r.get("rank") or 0, r.get("pid") or 0))

    def launcher_failures(self) -> dict[int, int]:
        """What a launcher said of the workers that failed (startup_hook._launcher_failures): {global rank: its
        exit code, negative for a signal}."""
        said: dict[int, int] = {}
        for path in sorted((self.path / "launcher").glob("*.json")):
            try:
                said.update({int(r): f["exitcode"] for r, f in json.loads(path.read_text()).items()
                             if isinstance(f.get("exitcode"), int)})
            except (OSError, ValueError, AttributeError):
                continue
        return said

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


def this_run() -> RunFolder | None:
    """The folder of the run this process belongs to (a process the hook attached in), else None."""
    path = os.environ.get(startup_hook.RUN_DIR)
    return RunFolder(path) if path else None


def options_of_this_run() -> dict:
    return json.loads(os.environ.get(OPTIONS, "{}"))
