"""The data path and memory, measured side by side in one run.

    python scripts/bench_data.py [--device cpu] [--samples 1000 --asvs 5000] [--json data.json]

1. Tokenisation of every ASV: the vectorised tokenizer vs a per-base Python loop (the naive way).
2. Collate throughput (batches/s) at the default config (token limit 512, batch 6) vs the model's step rate
   (training steps/s of the default AAM model on --device).
3. UniFrac over a realistic table (--samples x --asvs): scikit-bio vs the built-in sparse engine, both
   metrics, with the largest difference between them (scripts/bench_unifrac.py measures peak memory and the
   20,000 x 100,000 scale).
4. --asv-chunk-size: bytes the ASV encoder saves for backward (activation memory) with and without chunking,
   plus peak CUDA memory when on CUDA.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from debug_nan.aam.data.batches import Collator  # noqa: E402
from debug_nan.aam.data.synthetic import synthesize  # noqa: E402
from debug_nan.aam.data.tokens import tokenize  # noqa: E402
from debug_nan.aam.data.unifrac import unifrac_matrix, unifrac_skbio  # noqa: E402
from debug_nan.aam.model.aam import AAMConfig, AAMModel  # noqa: E402
from debug_nan.aam.task import aam_loss  # noqa: E402
from debug_nan.drivers.trainer.loop import resolve_device  # noqa: E402
from debug_nan.presentation.log import Log  # noqa: E402
from debug_nan.app.job_settings import build_settings  # noqa: E402


def timed(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def tokenize_per_base(seqs: list[str]) -> np.ndarray:
    lookup = {"A": 1, "C": 2, "G": 3, "T": 4}
    out = np.zeros((len(seqs), 151), dtype=np.uint8)
    for i, s in enumerate(seqs):
        out[i, 0] = 5
        for j, ch in enumerate(s[:150]):
            out[i, j + 1] = lookup.get(ch, 0)
    return out


def saved_bytes(model: torch.nn.Module, batch: dict) -> int:
    """Bytes of the tensors autograd saves for backward during one forward + loss (activation memory)."""
    total = 0
    seen: set[int] = set()

    def pack(t: torch.Tensor):
        nonlocal total
        key = t.untyped_storage().data_ptr()
        if key not in seen:
            seen.add(key)
            total += t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        aam_loss(model, batch)["loss"]
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--asvs", type=int, default=5000)
    ap.add_argument("--config", default=None, help="model/collate settings [default: the CLI defaults, AAM size]")
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args()
    device = resolve_device(args.device, Log(stream=io.StringIO()))
    out: dict = {"device": str(device), "torch": torch.__version__}
    d = build_settings(args.config, {})

    # 1. tokenisation
    data = synthesize(48, d.aam.data.token_limit, seed=0)
    seqs = data.sequences * 4
    vec, loop = timed(lambda: tokenize(seqs)), timed(lambda: tokenize_per_base(seqs), 1)
    assert (tokenize(seqs)[0] == tokenize_per_base(seqs)).all()
    out["tokenize"] = {"asvs": len(seqs), "vectorised_s": vec, "per_base_loop_s": loop, "speedup": loop / vec}
    print(f"tokenise {len(seqs)} ASVs: vectorised {vec * 1e3:.1f} ms, per-base loop {loop * 1e3:.0f} ms "
          f"({loop / vec:.0f}x)")

    # 2. collate vs model step rate, default config
    collate = Collator(data, np.zeros((data.n_samples,) * 2), d.aam.data.token_limit, "first")
    rng = np.random.default_rng(0)
    picks = [rng.choice(data.n_samples, d.aam.data.batch_size, replace=False) for _ in range(20)]
    collate_s = timed(lambda: [collate(p) for p in picks], 2) / len(picks)
    cfg = AAMConfig.from_settings(d.aam)
    model = AAMModel(cfg).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in collate(picks[0]).items()}

    def train_step():
        opt.zero_grad()
        aam_loss(model, batch)["loss"].backward()
        opt.step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    train_step()
    step_s = timed(train_step, 2)
    out["collate"] = {"batches_per_s": 1 / collate_s, "model_steps_per_s": 1 / step_s,
                      "ratio": step_s / collate_s}
    print(f"collate (token limit {d.aam.data.token_limit}, batch {d.aam.data.batch_size}): {1 / collate_s:.0f} "
          f"batches/s; model "
          f"training steps on {device}: {1 / step_s:.2f} steps/s; collate is {step_s / collate_s:.0f}x faster")

    # 3. UniFrac at scale
    big = synthesize(args.samples, max(1, args.asvs // 3), seed=1)
    print(f"UniFrac table: {big.n_samples} samples x {len(big.asv_ids)} ASVs ({big.counts.nnz:,} non-zeros)")
    out["unifrac"] = {"samples": big.n_samples, "asvs": len(big.asv_ids)}
    for metric in ("unweighted", "weighted"):
        t0 = time.perf_counter()
        m = unifrac_matrix(big.counts, big.asv_ids, big.tree, metric)
        t1 = time.perf_counter()
        s = unifrac_skbio(big.counts, big.asv_ids, big.tree, metric)
        t2 = time.perf_counter()
        diff = float(np.abs(m - s).max())
        out["unifrac"][metric] = {"builtin_s": t1 - t0, "skbio_s": t2 - t1, "max_abs_diff": diff}
        print(f"  {metric:<10} scikit-bio {t2 - t1:7.1f} s | built-in sparse engine {t1 - t0:6.1f} s "
              f"({(t2 - t1) / (t1 - t0):.1f}x) "
              f"| max |difference| {diff:.1e}")

    # 4. activation memory with --asv-chunk-size
    rows = {}
    for chunk in (None, 256, 64) if d.aam.data.token_limit >= 256 else (None, 16, 4):
        torch.manual_seed(0)
        m = AAMModel(AAMConfig(**{**cfg.__dict__, "asv_chunk_size": chunk, "dropout": 0.0})).to(device)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
        nbytes = saved_bytes(m, batch)
        peak = torch.cuda.max_memory_allocated(device) / 2**20 if device.type == "cuda" else None
        rows[str(chunk)] = {"saved_for_backward_mb": nbytes / 2**20, "peak_cuda_mb": peak}
        print(f"--asv-chunk-size {chunk or 'off':<4}: {nbytes / 2**20:8.1f} MiB saved for backward"
              + (f", peak CUDA {peak:.0f} MiB" if peak is not None else ""))
    out["asv_chunk_memory"] = rows
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(out, indent=2) + "\n")
        print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()
