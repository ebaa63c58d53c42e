"""UniFrac time and peak memory: the built-in sparse engine against scikit-bio, and alone at scale.

    python scripts/bench_unifrac.py --samples 1000 --features 5000 --skbio          # both, + max |difference|
    python scripts/bench_unifrac.py --samples 20000 --features 100000 --metric unweighted

Tables come from scripts/make_sparse_table.py (50-500 features per sample, a random tree). Each measurement
runs in its own child process, so its peak RSS (ru_maxrss) and CPU time are its own: the table and tree are built first
in that process (their size is reported as the baseline), then the distances are computed. The built-in engine
runs through debug_nan.aam.data.unifrac.unifrac_targets with a fresh cache folder (large results memory-mapped
there, as in a real run); scikit-bio gets the dense table it needs. Prints one line per run; --json writes all.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from make_sparse_table import make_sparse_table  # noqa: E402


def _rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class AnonymousPeak:
    """Peak RssAnon (MiB), sampled every 0.1 s: the process's own memory, without the pages of the
    memory-mapped result (file-backed, which ru_maxrss also counts and the kernel can drop at will)."""

    def __init__(self):
        import threading

        self.peak, self._stop = 0.0, threading.Event()
        self._sample()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                self.peak = max(self.peak, int(line.split()[1]) / 1024)

    def _run(self):
        while not self._stop.wait(0.1):
            self._sample()

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        self._sample()
        return self.peak


def _run(engine: str, metric: str, samples: int, features: int, seed: int, result_path: str, queue) -> None:
    import os

    counts, feature_ids, sample_ids, tree = make_sparse_table(samples, features, seed=seed)
    baseline = _rss_mib()
    anonymous = AnonymousPeak()
    start, cpu_start = time.perf_counter(), time.process_time()
    if engine == "skbio":
        from debug_nan.aam.data.unifrac import unifrac_skbio

        dist = unifrac_skbio(counts, feature_ids, tree, metric)
    else:
        from debug_nan.aam.data.unifrac import unifrac_targets

        cache = tempfile.TemporaryDirectory(prefix="bench-unifrac-")
        os.environ["DEBUG_NAN_CACHE_DIR"] = cache.name
        dist = unifrac_targets(counts, feature_ids, sample_ids, tree, metric, engine="builtin",
                               log=lambda line: print("   ", line, flush=True)).distances
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    anonymous_peak = anonymous.stop()
    if result_path:
        np.save(result_path, np.asarray(dist))
    if engine != "skbio":
        del dist
        cache.cleanup()
    queue.put({"engine": engine, "metric": metric, "samples": samples, "features": features,
               "nonzeros": int(counts.nnz), "seconds": seconds, "cpu_seconds": cpu, "peak_rss_mib": _rss_mib(),
               "peak_anonymous_rss_mib": anonymous_peak,
               "rss_before_mib": baseline})


def measure(engine: str, metric: str, samples: int, features: int, seed: int, result_path: str = "") -> dict:
    queue = mp.get_context("fork").Queue()
    proc = mp.get_context("fork").Process(target=_run, args=(engine, metric, samples, features, seed,
                                                              result_path, queue))
    proc.start()
    proc.join()
    if proc.exitcode != 0:
        raise SystemExit(f"{engine} {metric} failed (exit {proc.exitcode})")
    return queue.get()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--samples", type=int, default=1000)
    ap.add_argument("--features", type=int, default=5000)
    ap.add_argument("--metric", choices=("unweighted", "weighted", "both"), default="both")
    ap.add_argument("--skbio", action="store_true", help="also run scikit-bio and compare the numbers")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args()
    metrics = ("unweighted", "weighted") if args.metric == "both" else (args.metric,)
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for metric in metrics:
            engines = ("builtin", "skbio") if args.skbio else ("builtin",)
            results = {}
            for engine in engines:
                out = str(Path(folder) / f"{engine}-{metric}.npy") if args.skbio else ""
                row = measure(engine, metric, args.samples, args.features, args.seed, out)
                if args.skbio:
                    results[engine] = np.load(out)
                rows.append(row)
                print(f"{metric:<10} {engine:<8} {args.samples:,} x {args.features:,} ({row['nonzeros']:,} "
                      f"non-zeros): {row['seconds']:8.1f} s ({row['cpu_seconds']:.1f} s CPU), peak RSS "
                      f"{row['peak_rss_mib']:,.0f} MiB, of it "
                      f"anonymous {row['peak_anonymous_rss_mib']:,.0f} MiB (table + tree alone "
                      f"{row['rss_before_mib']:,.0f} MiB)", flush=True)
            if args.skbio:
                a, b = results["builtin"], results["skbio"]
                same_nan = bool((np.isnan(a) == np.isnan(b)).all())
                diff = float(np.nanmax(np.abs(a - b)))
                rows[-1]["max_abs_diff_vs_builtin"] = diff
                print(f"{metric:<10} max |built-in - scikit-bio| = {diff:.1e}, NaN in the same places: {same_nan}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(rows, indent=2) + "\n")
        print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()
