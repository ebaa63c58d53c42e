"""The launcher item of scripts/gpu_check.py (2+ CUDA GPUs): `debug-nan run -- <the launch command>` on NCCL, one GPU
per rank, as a user launches a multi-GPU run:

  * torchrun: `debug-nan run -- torchrun --nproc_per_node=2 launched.py --cuda` (tests/support/run/launched.py, a
    small DDP script): healthy, exit 0 and stdout byte for byte plain torchrun's; `--bug overflow` (rank 1's batch
    of step 3 has targets ~1e20): exit 1, the finding at step 3 named with rank 1;
  * Lightning: `debug-nan run -- python lightning_launched.py --accelerator gpu` (Trainer(devices=2,
    strategy="ddp"), Lightning's own launcher starts rank 1): the same two checks.
On fewer than 2 GPUs it is skipped with the reason (the CPU's gloo versions run in tests/e2e/ddp/test_run_launched.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from gpu_check_probes import NO_CUDA

REPO = Path(__file__).resolve().parents[1]
SUPPORT = REPO / "tests" / "support" / "run"
TORCHRUN = ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
LAUNCHES = {  # name -> the launch command after `python`, healthy (a broken run adds --bug overflow)
    "torchrun": [*TORCHRUN, str(SUPPORT / "launched.py"), "--cuda"],
    "lightning": [str(SUPPORT / "lightning_launched.py"), "--accelerator", "gpu"]}


def _first(path: Path) -> dict:
    report = json.loads(path.read_text()) if path.is_file() and path.stat().st_size else {}
    first = report.get("first_nonfinite") or {}
    return {k: first.get(k) for k in ("step", "phase", "op", "cause", "rank", "first_ranks")}


def launchers(check, item) -> None:
    import torch

    gpus = torch.cuda.device_count() if check.cuda else 0
    if not check.cuda:
        return item.skip(f"{NO_CUDA}: NCCL launches need 2 GPUs (gloo's run in tests/e2e/ddp/test_run_launched.py)")
    if gpus < 2:
        return item.skip(f"needs 2 CUDA GPUs (one per rank), {gpus} here")
    launches = {n: w for n, w in LAUNCHES.items() if n != "lightning" or _has_lightning()}
    if "lightning" not in launches:
        item.figures["lightning"] = "not run: lightning is not installed"
    said = []
    for name, words in launches.items():
        folder = check.folder(item, name)
        plain = check.run(item, words, stdout=folder / "plain.out")
        report = folder / "healthy.json"
        watched = check.run(item, ["-m", "debug_nan", "run", "--report", report, "--", sys.executable, *words],
                            stdout=folder / "watched.out")
        same = (folder / "plain.out").read_bytes() == (folder / "watched.out").read_bytes()
        item.expect(plain.rc == 0 and watched.rc == 0 and same,
                    f"{name} healthy: plain exit {plain.rc}, watched exit {watched.rc}, stdout identical: {same}")
        broken = folder / "overflow.json"
        done = check.run(item, ["-m", "debug_nan", "run", "--report", broken, "--", sys.executable, *words, "--bug",
                                "overflow"])
        found = _first(broken)
        item.expect(done.rc == 1 and (found["step"], found["cause"], found["rank"]) == (3, "overflow", 1)
                    and "rank 1" in done.out[done.out.rfind("=== SUMMARY"):],
                    f"{name} overflow on rank 1: exit {done.rc}, finding {found}")
        item.figures[name] = {"healthy_exit": watched.rc, "plain_exit": plain.rc, "stdout_identical": same,
                              "overflow_exit": done.rc, **found}
        said.append(f"{name}: healthy exit {watched.rc} (stdout identical: {same}), overflow -> step "
                    f"{found['step']} {found['op']} rank {found['rank']}")
    item.summary = "2 GPUs, nccl: " + "; ".join(said)


def _has_lightning() -> bool:
    import importlib.util

    return importlib.util.find_spec("lightning") is not None
