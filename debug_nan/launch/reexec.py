"""The pinpoint of `debug-nan run`: re-execute the user's command in a child process with the op-level tracer on
at the failing micro-batch (the child's side is launch/retrace.py), and read its answer.

The child starts from the random state the run started from (`start_rng`, taken before the script ran), so a
deterministic script takes the same steps; the child compares every micro-batch's loss with the run's, bit for
bit, and says so when they differ (then only the watch's finding stands). Its own output (the script's prints,
once more) goes to a file, shown in part only when the child fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import torch

from debug_nan.checks.snapshot import capture_rng
from debug_nan.frames import PACKAGE_PARENT


def start_rng() -> dict:
    """The random state the script will start from: torch's CPU generator (CUDA's starts from a fixed seed),
    Python's random and NumPy's global state (seeded from the OS when NumPy is imported)."""
    return capture_rng(torch.device("cpu"))


def deterministic_algorithms(on: bool) -> bool:
    """--deterministic: torch.use_deterministic_algorithms (warn only where an op has no deterministic kernel),
    with cuBLAS's workspace setting it needs; the child inherits both. Returns the setting before."""
    before = torch.are_deterministic_algorithms_enabled()
    if on:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
    return before


def reexecute(words: list[str], cwd: str, trip, losses, rng: dict, deterministic: bool = False) -> dict:
    """Run the command again under the tracer for `trip` (launch.watcher.Trip) -> the child's answer:
    {"finding": {...}} | {"diverged": why} | {"error": why} | {"missing": why} (no answer came back)."""
    with tempfile.TemporaryDirectory(prefix="debug-nan-run-") as folder:
        spec = {"words": words, "trip": {"step": trip.step, "micro": trip.micro, "optimizer": trip.optimizer,
                                         "check": asdict(trip.check) if trip.check is not None else None},
                "losses": list(losses), "deterministic": deterministic}
        Path(folder, "spec.json").write_text(json.dumps(spec))
        torch.save(rng, Path(folder, "rng.pt"))
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), PACKAGE_PARENT) if p)
        output = Path(folder, "output.txt")
        with output.open("w") as out:
            done = subprocess.run([sys.executable, "-m", "debug_nan.launch.retrace", folder], cwd=cwd, env=env,
                                  stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        answer = Path(folder, "answer.json")
        if answer.exists():
            return json.loads(answer.read_text())
        tail = output.read_text(errors="replace").strip().splitlines()[-8:]
        return {"missing": f"the re-execution ended (exit {done.returncode}) without reaching step {trip.step}, "
                           f"micro-batch {trip.micro}" + (": " + " | ".join(tail) if tail else "")}
