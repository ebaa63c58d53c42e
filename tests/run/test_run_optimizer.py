"""`debug-nan run`: a parameter that an optimizer step made non-finite is traced through that step in the
re-execution, and named as `--task` names it (the source is the script's `optimizer.step()` line)."""

from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

SCENARIOS = str(Path(__file__).resolve().parents[1] / "scenarios.py")
ADAM = """import torch
from tests.scenarios import adam_eps_zero

task = adam_eps_zero()  # Adam with eps=0 and a parameter whose gradient is exactly 0
model, optimizer = task.model, task.optimizer(task.model.parameters())
for step in range(3):
    for batch in task.batches:
        task.loss(model, batch).backward()
        optimizer.step()
        optimizer.zero_grad()
"""


def test_optimizer_phase_same_finding_as_the_task(tmp_path, run_here, run_cli):
    (tmp_path / "adam.py").write_text(ADAM)
    done, _, stderr = run_here("python", "adam.py")
    assert done.code == 1, done.output
    assert "op-level tracer on at step 1, micro-batch 1 (its optimizer step)" in stderr
    cli = run_cli("--task", f"{SCENARIOS}:adam_eps_zero", "--device", "cpu", "--max-steps", "4", "--no-bundle")
    assert cli.code == 1, cli.output
    fields = ("step", "micro_step", "phase", "module", "op", "cause", "kind")
    assert {k: done.first[k] for k in fields} == {k: cli.first[k] for k in fields} == {
        "step": 1, "micro_step": 1, "phase": "optimizer", "module": "", "op": "aten.addcdiv_.default",
        "cause": "nonfinite_parameter", "kind": "nan"}
    assert done.first["source"] == "adam.py:9"  # --task: torch/optim/adam.py (its step is the tool's call)
