"""The benchmark scripts run and write the JSON they promise (no timing is asserted: only shapes and sanity)."""

import json
import subprocess
import sys

from tests.conftest import REPO, TINY


def test_bench_overhead_writes_every_mode(tmp_path):
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_overhead.py"), "--device", "cpu",
                           "--config", TINY, "--repeats", "1", "--warmup", "0", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert set(data["ms_per_step"]) == {"plain", "watch", "trace", "detect_anomaly"}
    assert data["ratio_to_plain"]["plain"] == 1.0 and all(v > 0 for v in data["ms_per_step"].values())
    assert data["device"].startswith("cpu") and data["config"]["token_limit"] == 24
    assert "detect_anomaly" in proc.stdout


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
