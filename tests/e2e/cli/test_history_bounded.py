"""The history stays bounded on long runs, through the CLI: the JSON report of a thousand-step run keeps every
step's scalars and the per-layer values of the recent steps and of a thinning stride of older ones."""

import json

from debug_nan.engine.watch.history import RECENT_STEPS

TINY_TASK = """
import torch
from torch import nn


def build():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    batches = [{"x": torch.randn(4, 4), "y": torch.randn(4)}]
    return dict(model=model, batches=batches, loss=lambda m, b: (m(b["x"]).squeeze(-1) - b["y"]).pow(2).mean())
"""


def test_cli_report_of_a_thousand_step_run_stays_small(run_cli, tmp_path):
    (tmp_path / "tiny_task.py").write_text(TINY_TASK)
    report = run_cli("--task", f"{tmp_path / 'tiny_task.py'}:build", "--device", "cpu", "--max-steps", "1000").report
    assert report["status"] == "clean" and len(report["history"]) == 1000
    assert sum("max_abs_activation" in h for h in report["history"]) == RECENT_STEPS + 900 // 16
    assert "every 16th step" in report["history_kept"]
    assert len(json.dumps(report)) < 300_000  # 227 KB; with every per-layer value kept, 448 KB
