"""The benchmark scripts run and write the JSON they promise (no timing is asserted: only shapes and sanity).
bench_overhead.py's every mode on the AAM model and bench_memory.py are checked where the GPU check's quick run
runs them (tests/e2e/scripts/test_gpu_check.py)."""

import json
import math
import subprocess
import sys

from tests.conftest import REPO, TINY


def test_bench_overhead_model_preset_runs_the_watch(tmp_path):
    out = tmp_path / "deep.json"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_overhead.py"), "--device", "cpu",
                           "--model", "deep", "--modes", "plain,watch", "--repeats", "1", "--warmup", "0", "--split",
                           "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert set(data["ms_per_step"]) == {"plain", "watch"}
    assert (data["config"]["blocks"], data["config"]["d_model"], data["config"]["modules"]) == (24, 64, 295)
    split = data["split_ms"]
    assert len(split) == 5 and all(math.isfinite(v) for v in split.values())
    assert split["parameters + optimizer state (watch_params)"] > 0 and "split of the watch" in proc.stdout


def test_bench_data_writes_every_section(tmp_path):
    out = tmp_path / "data.json"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_data.py"), "--device", "cpu", "--config",
                           TINY, "--samples", "30", "--asvs", "90", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert data["tokenize"]["asvs"] > 0 and data["collate"]["batches_per_s"] > 0
    for metric in ("unweighted", "weighted"):
        assert data["unifrac"][metric]["max_abs_diff"] < 1e-9
    memory = data["asv_chunk_memory"]
    assert memory["4"]["saved_for_backward_mb"] < memory["None"]["saved_for_backward_mb"]


def test_bench_ddp_times_every_mode_on_two_ranks(tmp_path):
    out = tmp_path / "ddp.json"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_ddp.py"), "--model", "deep", "--accumulate",
                           "2", "--repeats", "2", "--warmup", "1", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert set(data["ratio_to_plain"]) == {"plain_ddp", "watch", "watch_at_end"}
    assert data["ratio_to_plain"]["plain_ddp"] == 1.0 and all(v > 0 for v in data["ms_per_step"].values())
    assert data["buckets"] >= 1 and all(len(v) == 2 for v in data["samples_ms"].values())
    assert "watch_at_end" in proc.stdout


def test_bench_run_alternates_watched_and_paused_steps_in_one_run(tmp_path):
    """--alternate: one `debug-nan run` process per repeat, its steady steps alternating watched and paused."""
    out = tmp_path / "alternate.json"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_run.py"), "--model", "tiny", "--alternate",
                           "--repeats", "1", "--steps", "4", "--warmup", "2", "--eval-batches", "1", "--json",
                           str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    tiny = json.loads(out.read_text())["tiny"]
    run = tiny["runs"][0]
    # 8 steady steps W P W P W P W P: each watched step but the first and last has paused steps either side
    assert len(run["wall"]["ratios"]) == 3 and len(run["eval"]["ratios"]) == 3
    assert all(r > 0 for r in run["wall"]["ratios"] + run["cpu"]["ratios"])
    assert tiny["ratio"] == run["wall"]["ratio"] and run["paused_residual_us"] >= 0
    assert "medians over every run's neighbour ratios" in proc.stdout


def test_neighbour_ratios_divide_each_watched_sample_by_the_paused_ones_beside_it():
    sys.path.insert(0, str(REPO / "scripts"))
    from bench_run import neighbour_ratios

    steps = [(False, 1.0), (True, 3.0), (False, 2.0), (True, 6.0), (False, 4.0)]
    assert neighbour_ratios(steps) == [2.0, 2.0]  # 3 / mean(1, 2), 6 / mean(2, 4)
    evals = [(False, 1.0), (False, 1.0), (True, 2.0), (True, 4.0), (False, 1.0), (False, 3.0)]
    assert neighbour_ratios(evals, per=2) == [3.0 / 1.0]  # median(2, 4) over median(1, 1, 1, 3)
