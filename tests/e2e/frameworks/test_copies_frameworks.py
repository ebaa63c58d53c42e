"""The state copied every few steps under the Lightning and HF callbacks (engine/session/copies.py): a NaN learning rate
set by the framework's own scheduler at step 5 is replayed after re-running the steps since the copy, and the
finding is the one an every-step copy gives.

From first principles: the poly factor (1 - step / 3) ** 0.9 is NaN once step > 3, i.e. from the 5th optimizer
step's lr on (the factor of step index 4); AdamW's update of step 5 multiplies by that lr: phase optimizer, step 5,
a NaN parameter. With a copy every 3 steps (steps 1 and 4), step 4 is re-run from its copy with its own lr."""

import numpy as np
import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

from torch.utils.data import DataLoader  # noqa: E402

from debug_nan.integrations.hf import DebugNaNCallback as HFCallback  # noqa: E402
from debug_nan.integrations.lightning import DebugNaNCallback as LightningCallback  # noqa: E402
from tests.support.frameworks import parity  # noqa: E402

STEPS = 6


def poly(optimizer):
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: float((1 - np.float64(step) / 3) ** 0.9))


def via_lightning(every, log):
    callback = LightningCallback(snapshot_every=every, log=str(log))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=STEPS, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    module = parity.lightning_module(parity.gpt2(), parity.adamw(lr=1e-3), poly)
    trainer.fit(module, DataLoader(parity.token_batches(), batch_size=None))
    return callback.finding


def via_hf(every, log, tmp_path):
    model = parity.gpt2()
    samples = [{key: value[i] for key, value in batch.items()} for batch in parity.token_batches()
               for i in range(parity.BATCH)]
    optimizer = parity.adamw(lr=1e-3)(model.parameters())
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / f"hf{every}"), per_device_train_batch_size=parity.BATCH, max_steps=STEPS,
        max_grad_norm=0.0, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0,
        train_sampling_strategy="sequential", logging_steps=1000)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=samples,
                                   optimizers=(optimizer, poly(optimizer)))
    callback = HFCallback(trainer, snapshot_every=every, log=str(log))
    trainer.add_callback(callback)
    trainer.train()
    return callback.finding


@pytest.mark.parametrize("framework", ["lightning", "hf"])
def test_a_nan_lr_of_the_frameworks_schedule_is_replayed_from_an_older_copy(framework, tmp_path):
    def run(every):
        log = tmp_path / f"{framework}{every}.log"
        return (via_lightning(every, log) if framework == "lightning" else via_hf(every, log, tmp_path)), \
            log.read_text()

    (every_step, _), (every_third, log) = run(1), run(3)
    assert "re-running steps 4..4 from the copy taken at step 4, to the state before step 5" in log
    fields = ("step", "micro_step", "phase", "kind", "module", "op", "source_line", "cause")
    assert every_step is not None and every_third is not None
    assert {k: getattr(every_third, k) for k in fields} == {k: getattr(every_step, k) for k in fields}
    assert (every_step.step, every_step.phase) == (5, "optimizer")
    assert every_step.op is not None and "nan" in every_step.explanation.lower()
