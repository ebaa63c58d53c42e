"""`outputs_every=` reaches the step session from every entry point: the Monitor and the Lightning / HF callbacks
measure module outputs every N steps (engine/session/output_schedule.py), and the loss and gradients in every step."""

import pytest
import torch

import debug_nan
from tests.support.frameworks import parity

STEPS = 4


def measured(history) -> list[bool]:
    return [r.outputs_measured for r in history.steps]


def assert_strided(history) -> None:
    assert measured(history) == [True, False, True, False]
    assert all(r.loss is not None and r.grad_norm is not None for r in history.steps)  # checked every step
    assert history.steps[0].activations and not history.steps[1].activations


def test_monitor():
    model = parity.gpt2()
    optimizer = parity.adamw()(model.parameters())
    monitor = debug_nan.Monitor(model, parity.lm_loss, optimizer, outputs_every=2)
    for batch in parity.token_batches(STEPS):
        with monitor.step(batch) as watched:
            loss = parity.lm_loss(model, batch)
            watched.watch_loss(loss)
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert_strided(monitor.session.history)


def test_lightning(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    from torch.utils.data import DataLoader

    from debug_nan.integrations.lightning import DebugNaNCallback

    callback = DebugNaNCallback(outputs_every=2, log=str(tmp_path / "log"))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=STEPS, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    trainer.fit(parity.lightning_module(parity.gpt2(), parity.adamw()),
                DataLoader(parity.token_batches(STEPS), batch_size=None))
    assert callback.status == "clean"
    assert_strided(callback.driver.session.history)


def test_hf(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from debug_nan.integrations.hf import DebugNaNCallback

    model = parity.gpt2()
    samples = [{key: value[i] for key, value in batch.items()} for batch in parity.token_batches(STEPS)
               for i in range(parity.BATCH)]
    optimizer = parity.adamw()(model.parameters())
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "hf"), per_device_train_batch_size=parity.BATCH, max_steps=STEPS,
        max_grad_norm=0.0, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0,
        train_sampling_strategy="sequential", logging_steps=1000)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=samples,
                                   optimizers=(optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)))
    callback = DebugNaNCallback(trainer, outputs_every=2, log=str(tmp_path / "log"))
    trainer.add_callback(callback)
    trainer.train()
    assert callback.status == "clean"
    assert_strided(callback.driver.session.history)
