"""One command that proves the GPU path (shared/cuda-checklist.md), within minutes, writing what it found.

    python scripts/gpu_check.py --device cuda --out DIR        # about 5-7 minutes on one H100-class GPU
    python scripts/gpu_check.py --device cpu --quick --out DIR # tiny sizes, same code path (CI, ~1-2 minutes)
    python scripts/gpu_check.py --device cuda --only oom,demo_job   # some items again

Writes DIR/gpu-check.json (every item: status pass / fail / skipped / not run, with the reason, its figures, the
exact commands it ran and its seconds) and DIR/gpu-check.md (a table to paste into the README: GPU model, torch
and CUDA versions, each item's figures or pass/fail); each command's output is kept in DIR/gpu-check-files/.
Both files are rewritten after every item, so a run cut short still leaves what it had. --budget-s stops it
cleanly: a command still running at the budget is stopped, and items not started are "not run: budget".
A failure inside an item is that item's `fail` (with the error's last lines), never the script's; the exit code
is 1 when an item failed, else 0. CUDA-only parts are "skipped (no CUDA)" on the CPU, never simulated.

The order: in-process items first (host syncs, fused attention), then the correctness commands, --jobs at a
time (their timings are not figures), then the timed and memory-hungry items alone (the out-of-memory run, the
overhead benchmarks), so that nothing else runs beside them; except with --quick on the CPU, where the timings are
a smoke test, not figures, and everything after the in-process items runs --jobs at a time.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import signal
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

LEFT_OUT = [
    "checklist 1: the whole test suite on CUDA does not fit in minutes; the CUDA-only tests and the watch's "
    "sync tests run (cuda_tests), and the host syncs of a watched micro-batch are counted on the device "
    "(watch_syncs)",
    "checklist 3: the Lightning and HF callbacks on CUDA (scripts/bench_integrations.py --device cuda); the "
    "overhead is measured through --task, Monitor and `debug-nan run`",
    "checklist 7: an in-place change before optimizer.step() against the side-stream snapshot has no test yet",
]


class BudgetOut(Exception):
    """The time budget ran out before or during a command."""


@dataclass
class Item:
    name: str
    title: str
    status: str = "pass"  # pass | fail | skipped | not run
    reason: str = ""
    summary: str = ""  # the figures in a few words, for the Markdown table
    figures: dict = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)
    seconds: float = 0.0
    failures: list[str] = field(default_factory=list)

    def expect(self, ok: bool, message: str) -> bool:
        if not ok:
            self.failures.append(message)
        return ok

    def skip(self, reason: str) -> None:
        self.status, self.reason = "skipped", reason


@dataclass
class Done:
    rc: int
    out: str  # stdout and stderr, as one stream
    seconds: float
    log: str  # where that output was kept


class Check:
    """What every item gets: the device, the sizes (quick or not), the output folder, the budget, `run`."""

    def __init__(self, device: str, quick: bool, out: Path, budget_s: float, jobs: int):
        self.device, self.quick, self.out, self.jobs = device, quick, out, jobs
        self.cuda = device.startswith("cuda")
        self.deadline = time.monotonic() + budget_s
        self.files = out / "gpu-check-files"
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def folder(self, item: Item, *parts: str) -> Path:
        path = self.files.joinpath(item.name, *parts)
        path.mkdir(parents=True, exist_ok=True)
        return path

    def run(self, item: Item, args: list[str], cwd: Path = REPO, stdout: Path | None = None) -> Done:
        """`python ARGS` in cwd, in its own process group (stopping it at the budget stops its children too); its
        output goes to a log file (with `stdout`: its stdout to that file alone, for a byte-for-byte comparison).
        BudgetOut when the budget ends first."""
        item.commands.append(shlex.join(["python", *map(str, args)]) + ("" if cwd == REPO else f"   (in {cwd})"))
        left = self.left()
        if left <= 1:
            raise BudgetOut("no time left to start it")
        with self._lock:
            n = self._counts[item.name] = self._counts.get(item.name, 0) + 1
        log = self.folder(item) / f"{n:02d}.log"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
                   PYTHONUNBUFFERED="1")
        start = time.monotonic()
        with open(log, "w") as stream:
            stream.write(item.commands[-1] + "\n\n")
            stream.flush()
            apart = open(stdout, "w") if stdout is not None else None
            try:
                proc = subprocess.Popen([sys.executable, *map(str, args)], cwd=cwd, env=env, stdout=apart or stream,
                                        stderr=stream if apart else subprocess.STDOUT, start_new_session=True)
            finally:
                if apart is not None:
                    apart.close()
            try:
                rc = proc.wait(timeout=left)
            except BaseException as exc:  # the budget, or Ctrl-C: its own session would not see the SIGINT
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                if isinstance(exc, subprocess.TimeoutExpired):
                    raise BudgetOut(f"stopped after {time.monotonic() - start:.0f} s") from None
                raise
        return Done(rc, log.read_text(errors="replace"), time.monotonic() - start, str(log))

    def map(self, fn, args: list) -> list:
        """[fn(*a) for a in args], --jobs at a time (2 on CUDA: each may hold a run's worth of GPU memory)."""
        with ThreadPoolExecutor(max_workers=min(self.jobs, 2) if self.cuda else self.jobs) as pool:
            return list(pool.map(lambda a: fn(*a), args))


def tail(text: str, lines: int = 8) -> str:
    """The last lines of an output or a traceback (without the caret lines under the code)."""
    kept = [line for line in text.strip().splitlines() if line.strip() and set(line.strip()) - set("^~")]
    return "\n".join(kept[-lines:])


def run_item(check: Check, spec, results: dict[str, Item], write, in_process: bool = False) -> None:
    name, title, fn = spec[0], spec[1], spec[2]
    item = Item(name, title)
    if in_process:  # its command: this script, for that item alone
        item.commands.append(f"python scripts/gpu_check.py --device {check.device}{' --quick' if check.quick else ''}"
                             f" --only {name}")
    start = time.monotonic()
    if check.left() <= 1:
        item.status, item.reason = "not run", "budget"
    else:
        try:
            fn(check, item)
        except BudgetOut as exc:
            item.status, item.reason = "not run", f"budget: {exc}"
        except Exception:  # noqa: BLE001 - an item's failure is its own, never the script's
            item.failures.append(tail(traceback.format_exc()))
        if item.failures and item.status != "not run":
            item.status, item.reason = "fail", "; ".join(item.failures)
    item.seconds = round(time.monotonic() - start, 1)
    results[name] = item
    print(f"[gpu_check] {name}: {item.status}{f' ({item.reason[:200]})' if item.reason else ''}"
          f"{f' | {item.summary}' if item.summary else ''} [{item.seconds} s]", flush=True)
    write()


def environment(check: Check) -> dict:
    import torch

    info = {"device": check.device, "torch": torch.__version__, "cuda": torch.version.cuda, "gpu": None,
            "gpu_memory_gib": None, "python": platform.python_version(), "cpus": os.cpu_count(),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    if check.cuda:
        props = torch.cuda.get_device_properties(torch.device(check.device))
        info.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1))
    try:
        info["commit"] = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                                        text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info["commit"] = None
    return info


def markdown(report: dict) -> str:
    env = report["environment"]
    where = (f"{env['gpu']} ({env['gpu_memory_gib']} GiB), torch {env['torch']}, CUDA {env['cuda']}" if env.get("gpu")
             else f"no GPU: {env['device']}, torch {env.get('torch')}")
    lines = [f"GPU check on {where}: `{report['command']}` (commit {env.get('commit')}, {env.get('date')}, "
             f"{report['elapsed_s']:.0f} s of a {report['budget_s']:.0f} s "
             f"budget{', quick sizes' if report['quick'] else ''})",
             "", "| check | result | figures | s |", "|---|---|---|---|"]
    for item in report["items"]:
        reason = item["reason"] if item["status"] != "pass" else ""
        result = reason if reason.startswith(item["status"]) else item["status"] + (f": {reason}" if reason else "")
        cells = [item["title"], result[:300], item["summary"] or "-", f"{item['seconds']:.0f}"]
        lines.append("| " + " | ".join(c.replace("|", "/").replace("\n", " ") for c in cells) + " |")
    lines += ["", "Left out: " + "; ".join(report["left_out"]) + "."]
    return "\n".join(lines) + "\n"


def write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def out_folder(arg: str) -> Path:
    """--out as an absolute path: the items run their commands in other folders (the repository, their own), where
    a relative path would name another place."""
    return Path(arg).expanduser().resolve()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto", help="cuda, cuda:N, cpu or auto [default: auto]")
    ap.add_argument("--quick", action="store_true", help="tiny sizes (CI on the CPU), the same items and outputs")
    ap.add_argument("--out", default=".", help="output folder [default: .]")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop cleanly after this long [default: 420]")
    ap.add_argument("--jobs", type=int, default=3, help="correctness commands at a time [default: 3]")
    ap.add_argument("--only", help="a comma list of item names (default: all)")
    args = ap.parse_args(argv)
    started = time.monotonic()
    import torch
    from gpu_check_items import ALONE, IN_PROCESS, POOLED

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    out = out_folder(args.out)
    out.mkdir(parents=True, exist_ok=True)
    check = Check(device, args.quick, out, args.budget_s, max(1, args.jobs))
    specs = [*IN_PROCESS, *POOLED, *ALONE]
    only = set(args.only.split(",")) if args.only else None
    unknown = (only or set()) - {s[0] for s in specs}
    if unknown:
        ap.error(f"--only: unknown {', '.join(sorted(unknown))} (choose from {', '.join(s[0] for s in specs)})")
    chosen = [s for s in specs if only is None or s[0] in only]
    command = shlex.join(["python", "scripts/gpu_check.py", *(argv if argv is not None else sys.argv[1:])])
    results: dict[str, Item] = {}
    report = {"command": command, "quick": args.quick, "budget_s": args.budget_s, "left_out": LEFT_OUT,
              "environment": {"device": device}}

    def write() -> None:
        report["elapsed_s"] = round(time.monotonic() - started, 1)
        items = [results.get(s[0]) or Item(s[0], s[1], status="not run", reason="budget" if check.left() <= 1
                                            else "not yet") for s in chosen]
        report["items"] = [{k: v for k, v in asdict(i).items() if k != "failures"} for i in items]
        report["counts"] = {s: sum(i.status == s for i in items) for s in ("pass", "fail", "skipped", "not run")}
        write_atomic(out / "gpu-check.json", json.dumps(report, indent=2, default=str) + "\n")
        write_atomic(out / "gpu-check.md", markdown(report))

    try:
        report["environment"] = environment(check)
    except Exception:  # noqa: BLE001 - a broken CUDA install is itself a finding: the items say what fails
        report["environment"]["error"] = tail(traceback.format_exc())
    print(f"[gpu_check] {report['environment']} | budget {args.budget_s:.0f} s | quick {args.quick}", flush=True)
    write_lock = threading.Lock()

    def locked_write() -> None:
        with write_lock:
            write()

    alone = [s for s in ALONE if check.cuda or not args.quick]
    for spec in (s for s in chosen if s in IN_PROCESS):
        run_item(check, spec, results, locked_write, in_process=True)
    with ThreadPoolExecutor(max_workers=check.jobs) as pool:
        for future in [pool.submit(run_item, check, s, results, locked_write) for s in chosen
                       if s not in IN_PROCESS and s not in alone]:
            future.result()
    for spec in (s for s in chosen if s in alone):
        run_item(check, spec, results, locked_write)
    locked_write()
    print(f"[gpu_check] wrote {out / 'gpu-check.json'} and {out / 'gpu-check.md'}: {report['counts']}", flush=True)
    return 1 if report["counts"]["fail"] else 0


if __name__ == "__main__":
    sys.exit(main())
