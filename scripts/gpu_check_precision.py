"""The mixed-precision item of scripts/gpu_check.py (CUDA only): `debug-nan run` on small fp16 scripts with a real
CUDA GradScaler and CUDA autocast, and SDPA's flash and memory-efficient kernels in fp16.

  * rms: fp16 autocast + torch.amp.GradScaler("cuda"); healthy, the first steps' overflow is the scaler's (one skip
    line, exit 0); `rms.py 5` zeroes padding rows from step 5, where a hand-written RMS norm's sqrt(0) makes a NaN
    gradient at any scale: the finding is step 5, SqrtBackward0, grad_at_singularity;
  * attention: q @ k^T without the 1/sqrt(d) scale on one batch in raw units under fp16 autocast: named at its bmm,
    `overflow`, with the float16 evidence;
  * sdpa_BACKEND: an all-masked row through F.scaled_dot_product_attention on the flash / memory-efficient kernel
    in fp16 autocast: where the plain run's loss went NaN the finding is all_masked_softmax, else the run is clean.
"""

from __future__ import annotations

import json

RMS = """import sys

import torch
from torch import nn

torch.manual_seed(0)


class RMSNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        rms = torch.sqrt(x.float().pow(2).mean(-1, keepdim=True))
        return (x / (rms + 1e-6)).to(x.dtype) * self.weight


model = nn.Sequential(nn.Linear(64, 256, bias=False), RMSNorm(256), nn.Linear(256, 1)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
scaler = torch.amp.GradScaler("cuda")
padded_from = int(sys.argv[1]) if len(sys.argv) > 1 else 0
for step in range(1, 9):
    x, y = torch.randn(8, 32, 64, device="cuda"), torch.randn(8, 32, device="cuda")
    if padded_from and step >= padded_from:
        x[:, -4:] = 0
    with torch.autocast("cuda", dtype=torch.float16):
        pred = model(x).squeeze(-1)
    loss = (pred.float() - y).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f} scale {scaler.get_scale():g}")
"""

ATTENTION = """import torch
from torch import nn

torch.manual_seed(0)


class Attention(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.q, self.k, self.v, self.head = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, 1)

    def forward(self, x):
        scores = self.q(x) @ self.k(x).transpose(-2, -1)
        return self.head(torch.softmax(scores, dim=-1) @ self.v(x)).squeeze(-1)


model = Attention().cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
for step in range(1, 6):
    x, y = torch.randn(4, 32, 64, device="cuda"), torch.randn(4, 32, device="cuda")
    if step == 3:
        x = x * 300.0
    with torch.autocast("cuda", dtype=torch.float16):
        pred = model(x)
    loss = (pred.float() - y).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
"""

SDPA = """import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

torch.manual_seed(0)
backend = SDPBackend.FLASH_ATTENTION if sys.argv[1] == "flash" else SDPBackend.EFFICIENT_ATTENTION


class Attention(nn.Module):
    def __init__(self, d=64, heads=4):
        super().__init__()
        self.qkv, self.out, self.heads = nn.Linear(d, 3 * d), nn.Linear(d, d), heads

    def forward(self, x, keep):
        b, n, d = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        with sdpa_kernel([backend]):
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=keep[:, None, None, :])
        return self.out(y.transpose(1, 2).reshape(b, n, d))


model = Attention().cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
for step in range(1, 4):
    x = torch.randn(2, 16, 64, device="cuda")
    keep = torch.ones(2, 16, dtype=torch.bool, device="cuda")
    if step == 2:
        keep[1] = False  # sample 1 hides every key
    with torch.autocast("cuda", dtype=torch.float16):
        out = model(x, keep)
    loss = out.float().square().mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
"""


def _run(check, item, folder, name: str, source: str, *args: str):
    """`debug-nan run -- python NAME ARGS` (and the script alone) -> (run's exit, its finding or {}, its output,
    the plain run's output)."""
    (folder / name).write_text(source)
    alone = check.run(item, [name, *args], cwd=folder)
    report = folder / f"{name}.{'-'.join(args) or 'healthy'}.json"
    done = check.run(item, ["-m", "debug_nan", "run", "--no-bundle", "--report", report, "--", "python", name, *args],
                      cwd=folder)
    data = json.loads(report.read_text()) if report.exists() else {}
    return done.rc, data.get("first_nonfinite") or {}, done.out, alone.out


def mixed_precision(check, item) -> None:
    """fp16 on CUDA through `debug-nan run`: a real GradScaler's skips and a real NaN under it, an fp16 overflow,
    SDPA's fused kernels in fp16."""
    if not check.cuda:
        return item.skip("skipped (no CUDA): CPU autocast and its GradScaler are the CI tests' "
                         "(tests/e2e/run/test_run_precision.py)")
    folder, said = check.folder(item, "scripts"), []
    rc, found, out, _ = _run(check, item, folder, "rms.py", RMS)
    item.figures["rms_healthy"] = {"exit": rc, "skip_lines": out.count("skipped by the GradScaler:")}
    item.expect(rc == 0 and found == {}, f"rms healthy: exit {rc}, {found}")
    rc, found, out, _ = _run(check, item, folder, "rms.py", RMS, "5")
    item.figures["rms_nan"] = {"exit": rc, **{k: found.get(k) for k in ("step", "phase", "backward_node", "cause")}}
    item.expect((rc, found.get("step"), found.get("backward_node"), found.get("cause")) == (
        1, 5, "SqrtBackward0", "grad_at_singularity"), f"rms from step 5: exit {rc}, {found}")
    said.append(f"GradScaler: healthy exit {item.figures['rms_healthy']['exit']}, NaN at step {found.get('step')}")
    rc, found, out, _ = _run(check, item, folder, "attention.py", ATTENTION)
    item.figures["attention"] = {"exit": rc, **{k: found.get(k) for k in ("step", "op", "cause")},
                                 "fp16_evidence": "float16 result beyond 65504" in found.get("explanation", "")}
    item.expect(rc == 1 and found.get("step") == 3 and found.get("cause") == "overflow"
                and item.figures["attention"]["fp16_evidence"], f"attention: exit {rc}, {found}")
    said.append(f"fp16 scores: {found.get('op')} {found.get('cause')}")
    for backend in ("flash", "efficient"):
        rc, found, out, plain = _run(check, item, folder, "sdpa.py", SDPA, backend)
        made_nan = "loss nan" in plain
        item.figures[f"sdpa_{backend}"] = {"exit": rc, "plain_nan": made_nan, "cause": found.get("cause")}
        item.expect((rc, found.get("cause")) == ((1, "all_masked_softmax") if made_nan else (0, None)),
                    f"sdpa {backend}: plain NaN {made_nan}, exit {rc}, {found}")
        said.append(f"sdpa {backend}: {found.get('cause') or 'clean'}")
    item.summary = "; ".join(said)
