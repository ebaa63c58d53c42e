"""How long `debug-nan run` takes to answer, as a multiple of one training step, by where and when the NaN comes.

    python scripts/bench_pinpoint.py [--at 5,50,300] [--phases forward,loss,backward,optimizer] [--width 64]
                                     [--threads 1] [--json out.json]

The user's script is this file with --as-user: a plain loop over a small attention model (masked softmax, MLP),
its batches made from a seeded generator, with one NaN planted at step AT in one phase:
  forward    a sample whose keys are all masked (softmax over -inf only)
  loss       a hand-written log-sum-exp over logits scaled past exp's float32 range
  backward   0 * sqrt(0) added to the loss: finite, its backward is 0/0
  optimizer  the script sets its learning rate to NaN before optimizer.step()
For each (phase, AT) it runs the script plainly for AT steps (its own median ms per step, printed at its end) and
through `python -m debug_nan run`, whose JSON report gives `pinpoint_seconds`: from the watch's sync that tripped
to the finding (the replay under the op-level tracer included). The ratio is that over one plain step: flat in AT
is the point (the answer comes from the run's own state, never from re-running the steps before it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PHASES = ("forward", "loss", "backward", "optimizer")


def as_user(phase: str, at: int, width: int) -> None:
    """The user's loop: AT steps, the NaN planted at step AT in `phase`; prints its median ms per step."""
    import statistics
    import time

    import torch
    from torch import nn

    torch.manual_seed(0)

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

        def forward(self, x, valid):
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            scores = (q @ k.transpose(1, 2)) / width ** 0.5
            scores = scores.masked_fill(~valid[:, None, :], float("-inf"))
            x = x + self.out(torch.softmax(scores, dim=-1) @ v)
            return x + self.mlp(x)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.blocks = nn.Linear(16, width), nn.ModuleList(Attention() for _ in range(2))
            self.head = nn.Linear(width, 10)

        def forward(self, x, valid):
            h = self.embed(x)
            for block in self.blocks:
                h = block(h, valid)
            return self.head(h.mean(1))

    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    times = []
    for step in range(1, at + 1):
        began = time.perf_counter()
        x, label = torch.randn(16, 32, 16, generator=g), torch.randint(0, 10, (16,), generator=g)
        valid = torch.ones(16, 32, dtype=torch.bool)
        valid[:, 24:] = False
        if phase == "forward" and step == at:
            valid[3] = False
        logits = model(x, valid)
        scale = 1e4 if phase == "loss" and step == at else 1.0
        z = logits * scale
        loss = (z.exp().sum(-1).log() - z.gather(1, label[:, None]).squeeze(1)).mean()
        if phase == "backward":
            loss = loss + 0.0 * (logits[:, 0] * (0.0 if step == at else 1.0)).pow(2).sum().sqrt()
        loss.backward()
        if phase == "optimizer" and step == at:
            optimizer.param_groups[0]["lr"] = float("nan")
        optimizer.step()
        optimizer.zero_grad()
        times.append(time.perf_counter() - began)
    steady = times[min(16, len(times) - 1):] or times
    print(f"step_ms {statistics.median(steady) * 1e3:.3f}")


def measure(phase: str, at: int, a, folder: Path) -> dict:
    user = [sys.executable, str(Path(__file__).resolve()), "--as-user", phase, str(at), str(a.width)]
    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), PYTHONPATH=str(REPO))
    plain = subprocess.run(user, capture_output=True, text=True, env=env, check=True)
    step_ms = float(plain.stdout.split("step_ms ")[1])
    report = folder / f"{phase}-{at}.json"
    watched = subprocess.run([sys.executable, "-m", "debug_nan", "run", "--report", str(report), "--", *user],
                             capture_output=True, text=True, env=env, cwd=folder)
    data = json.loads(report.read_text())
    first = data["first_nonfinite"] or {}
    seconds = data["integration"].get("pinpoint_seconds")
    return {"phase": phase, "at": at, "exit": watched.returncode, "found_step": first.get("step"),
            "found_phase": first.get("phase"), "op": first.get("op"), "step_ms": step_ms,
            "pinpoint_s": seconds, "steps": None if seconds is None else seconds * 1e3 / step_ms}


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--as-user":
        as_user(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
        return
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--at", default="5,50,300")
    p.add_argument("--phases", default=",".join(PHASES))
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json")
    a = p.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for phase in a.phases.split(","):
            for at in (int(s) for s in a.at.split(",")):
                row = measure(phase, at, a, Path(folder))
                rows.append(row)
                print(f"{phase:>9} at step {at:>4}: found step {row['found_step']} {row['found_phase']} "
                      f"{row['op']}; one step {row['step_ms']:.2f} ms, trip to finding {row['pinpoint_s']} s "
                      f"= {row['steps']:.1f} steps" if row["steps"] is not None else f"{phase} at {at}: {row}",
                      flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
