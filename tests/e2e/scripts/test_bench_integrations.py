"""scripts/bench_integrations.py runs both frameworks and writes the JSON it promises (no timing asserted)."""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytest.importorskip("lightning.pytorch")
pytest.importorskip("transformers")


def test_bench_integrations_writes_both_frameworks(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_integrations.py"), "--hidden", "32",
                           "--layers", "1", "--seq", "16", "--batch", "2", "--steps", "3", "--warmup", "1",
                           "--repeats", "1", "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(out.read_text())
    assert set(data["results"]) == {"lightning", "hf"}
    for result in data["results"].values():
        assert result["plain_ms_per_step"] > 0 and result["watched_ms_per_step"] > 0
        assert len(result["ratios"]) == 1 and result["median_ratio"] > 0
    assert data["config"]["steps"] == 3 and data["device"].startswith("cpu")
    assert "watched ms/step" in proc.stdout
