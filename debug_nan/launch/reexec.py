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
import time
from dataclasses import asdict
from pathlib import Path

import torch

from debug_nan.checks.snapshot import capture_rng
from debug_nan.frames import PACKAGE_PARENT
from debug_nan.launch.ranks import child_env

STRANDED_GRACE_S = 3.0  # a rank's child may finish its last ops a little after another's ended


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


def reexecute(words: list[str], cwd: str, trip, losses, rng: dict, deterministic: bool = False, ranks=None,
              trace: bool = True, timeout_s: float | None = None) -> dict:
    """Run the command again under the tracer for `trip` (launch.watcher.Trip) -> the child's answer:
    {"finding": {...}} | {"diverged": why} | {"error": why} | {"missing": why} (no answer came back).
    Under torchrun (`ranks`, launch/ranks.py) every rank runs this at once: the children rendezvous on a fresh
    port and run in step to the end of the failing micro-batch (its optimizer step); `trace`: this rank's child
    traces (it saw the harm first), else it only takes part in the collectives."""
    with tempfile.TemporaryDirectory(prefix="debug-nan-run-") as folder:
        spec = {"words": words, "trip": {"step": trip.step, "micro": trip.micro, "optimizer": trip.optimizer,
                                         "check": asdict(trip.check) if trip.check is not None else None},
                "losses": list(losses), "deterministic": deterministic, "ddp": ranks is not None, "trace": trace}
        Path(folder, "spec.json").write_text(json.dumps(spec))
        torch.save(rng, Path(folder, "rng.pt"))
        env = child_env(ranks.fresh_port()) if ranks is not None else dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (env.get("PYTHONPATH"), PACKAGE_PARENT) if p)
        output, answer = Path(folder, "output.txt"), Path(folder, "answer.json")
        with output.open("w") as out:
            child = subprocess.Popen([sys.executable, "-m", "debug_nan.launch.retrace", folder], cwd=cwd, env=env,
                                     stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            try:
                stopped = _supervise(child, ranks, answer, timeout_s)
            finally:
                if child.poll() is None:  # interrupted: the child goes too
                    child.kill()
                    child.wait()
        if answer.exists():
            return json.loads(answer.read_text())
        tail = output.read_text(errors="replace").strip().splitlines()[-8:]
        return {"missing": (stopped or f"the re-execution ended (exit {child.returncode}) without reaching step "
                                       f"{trip.step}, micro-batch {trip.micro}") + (": " + " | ".join(tail) if tail
                                                                                   else "")}


def _supervise(child: subprocess.Popen, ranks, answer: Path, timeout_s: float | None) -> str | None:
    """Wait for the child. Under torchrun, never a hang: a child still running after another rank's ended
    early (it failed, or diverged and stopped) waits in a collective that will not come, and one past
    `timeout_s` is stuck: it is stopped, and the reason returned. Each rank posts how its child ended."""
    if ranks is None:
        child.wait()
        return None
    deadline = time.monotonic() + (timeout_s or 600.0)
    stranded_since, stopped = None, None
    while child.poll() is None:
        early = [r for r, how in ranks.posted("reexec-end").items() if how != "lockstep"]
        now = time.monotonic()
        if early and stranded_since is None:
            stranded_since = now
        if stranded_since is not None and now - stranded_since > STRANDED_GRACE_S:
            stopped = (f"the re-execution of rank {early[0]} ended before the failing micro-batch's end, so this "
                       f"rank's (waiting for it in a collective) was stopped")
        elif now > deadline:
            stopped = f"the re-execution did not finish within {timeout_s:.0f} s (3x the run's time + 2 min)"
        if stopped:
            child.kill()
            child.wait()
            break
        time.sleep(0.05)
    ended = json.loads(answer.read_text()).get("lockstep") if answer.exists() else False
    ranks.post("reexec-end", "lockstep" if ended else "early")
    return stopped
