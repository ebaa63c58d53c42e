"""The watch's buffer check (engine/watch/buffer_watch.py) per micro-batch, against a plain training step.

    OMP_WAIT_POLICY=PASSIVE python scripts/bench_buffer_check.py

A conv + BatchNorm net (17 BatchNorm2d, 51 buffers, batch 8 of 3x32x32) and the bench presets `deep` and `gpt2`
(which hold no floating buffer: the check costs them nothing). Minimum over repeats of BufferWatch.record()
plus the host read of its norms (in a run that read is part of the watch's one sync, so this overstates it)."""

import sys
import time
from pathlib import Path

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from bench_models import build_lm_task  # noqa: E402

from debug_nan.engine.watch.buffer_watch import BufferWatch  # noqa: E402


def best(fn, n: int) -> float:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def conv_bn(blocks: int = 16, c: int = 32) -> nn.Module:
    layers = [nn.Conv2d(3, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU()]
    for _ in range(blocks):
        layers += [nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c), nn.ReLU()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(c, 10))


def check_time(model: nn.Module) -> float:
    watch = BufferWatch(model)

    def record():
        norms = [t for _, _, part in watch.record() for t in part]
        if norms:
            torch.stack(norms).tolist()

    return best(record, 200)


def main() -> None:
    torch.manual_seed(0)
    model, x, y = conv_bn(), torch.randn(8, 3, 32, 32), torch.randint(0, 10, (8,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)

    def step():
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    plain, check = best(step, 30), check_time(model)
    n = sum(1 for b in model.buffers() if b.is_floating_point())
    print(f"conv+BN ({n} floating buffers): plain step {plain * 1e3:.1f} ms, buffer check {check * 1e6:.0f} us "
          f"= {100 * check / plain:.2f}% of the step")
    for name in ("deep", "gpt2"):
        task = build_lm_task(name)
        n = sum(1 for b in task.model.buffers() if b.is_floating_point())
        print(f"{name}: {n} floating buffers, buffer check {check_time(task.model) * 1e6:.0f} us")


if __name__ == "__main__":
    main()
