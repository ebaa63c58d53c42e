"""scripts/make_sparse_table.py and scripts/bench_unifrac.py run and give what they promise (no timing asserted)."""

import json
import subprocess
import sys

import biom
import numpy as np
from skbio import TreeNode

from tests.conftest import REPO


def test_make_sparse_table_writes_a_table_and_its_tree(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "make_sparse_table.py"), "--samples", "40",
                           "--features", "300", "--min-richness", "5", "--max-richness", "20", "--out",
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    table = biom.load_table(str(tmp_path / "table.biom"))
    tree = TreeNode.read(str(tmp_path / "tree.nwk"))
    assert table.shape == (300, 40)
    richness = (table.matrix_data > 0).sum(axis=0).A1
    assert richness.min() >= 1 and richness.max() <= 20
    assert {t.name for t in tree.tips()} == set(table.ids("observation"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table.biom", "tree.nwk"]


def test_bench_unifrac_compares_with_skbio(tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_unifrac.py"), "--samples", "30",
                           "--features", "200", "--skbio", "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(out.read_text())
    assert [(r["metric"], r["engine"]) for r in rows] == [("unweighted", "builtin"), ("unweighted", "skbio"),
                                                           ("weighted", "builtin"), ("weighted", "skbio")]
    assert all(r["peak_rss_mib"] >= r["peak_anonymous_rss_mib"] > 0 and r["seconds"] > 0 for r in rows)
    assert all(r["max_abs_diff_vs_builtin"] < 1e-12 for r in rows if r["engine"] == "skbio")
    assert np.isfinite([r["cpu_seconds"] for r in rows]).all()
