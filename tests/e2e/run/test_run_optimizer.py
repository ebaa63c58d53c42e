"""`debug-nan run`: a parameter that an optimizer step made non-finite is traced through that step, replayed in
place, and named as `--task` names it (the source is the script's `optimizer.step()` line)."""


import pytest

from tests.support import SUPPORT

SCENARIOS = str(SUPPORT / "scenarios.py")
ADAM = """import torch
from tests.support.scenarios import adam_eps_zero

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
    assert "replaying step 1 micro-batch 1 from the snapshot under the op-level tracer (forward, loss, backward, " \
           "optimizer)" in stderr
    cli = run_cli("--task", f"{SCENARIOS}:adam_eps_zero", "--device", "cpu", "--max-steps", "4", "--no-bundle")
    assert cli.code == 1, cli.output
    fields = ("step", "micro_step", "phase", "module", "op", "cause", "kind")
    assert {k: done.first[k] for k in fields} == {k: cli.first[k] for k in fields} == {
        "step": 1, "micro_step": 1, "phase": "optimizer", "module": "", "op": "aten.addcdiv_.default",
        "cause": "nonfinite_parameter", "kind": "nan"}
    assert done.first["source"] == "adam.py:9"  # --task: torch/optim/adam.py (its step is the tool's call)


LIGHTNING_ADAM = """import lightning.pytorch as pl
from torch.utils.data import DataLoader

from tests.support.scenarios import adam_eps_zero

task = adam_eps_zero()


class Lit(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.model = task.model

    def training_step(self, batch, batch_idx):
        return task.loss(self.model, batch)

    def configure_optimizers(self):
        return task.optimizer(self.parameters())


trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=3, logger=False, enable_checkpointing=False,
                     enable_progress_bar=False, enable_model_summary=False)
trainer.fit(Lit(), DataLoader(task.batches, batch_size=None))
"""


def test_optimizer_phase_inside_lightnings_closure(tmp_path, run_here):
    """Lightning steps with optimizer.step(closure): the step begins before its forward; the trace still covers
    the update. The root is the model whose forward training_step calls (names as in --task)."""
    pytest.importorskip("lightning")
    (tmp_path / "lit_adam.py").write_text(LIGHTNING_ADAM)
    done, _, stderr = run_here("python", "lit_adam.py")
    assert done.code == 1, done.output
    assert "[debug-nan] watching Gated (10 parameters) and its Adam" in stderr
    assert (done.first["step"], done.first["micro_step"], done.first["phase"], done.first["op"],
            done.first["cause"]) == (1, 1, "optimizer", "aten.addcdiv_.default", "nonfinite_parameter")
