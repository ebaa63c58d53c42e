"""The callbacks watch the validation forwards too: a Lightning `validation_step` (and its sanity check) and the HF
Trainer's evaluation loop. Training finite, one held-out sample hides every key from the attention: the finding is
phase `eval`, at the last optimizer step before it, the masked softmax named at its line, and training stops there."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

SOFTMAX_LINE = 26  # `return self.head((scores.softmax(-1) @ h).mean(1))` below


class Attention(torch.nn.Module):
    """[B, L] tokens and a [B, L] key mask -> [B, 2] logits; a row whose mask hides every key is 0/0 in the softmax."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8)
        self.query, self.key = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, tokens, keep, labels=None):
        h = self.embed(tokens)
        scores = self.query(h) @ self.key(h).transpose(1, 2) / 8 ** 0.5
        scores = scores.masked_fill(~keep[:, None, :], float("-inf"))
        return self.head((scores.softmax(-1) @ h).mean(1))


def data(hide_row: int | None):
    """16 samples of 6 tokens; `hide_row`'s mask hides every key (None: none does)."""
    g = torch.Generator().manual_seed(0)
    tokens, labels = torch.randint(0, 10, (16, 6), generator=g), torch.randint(0, 2, (16,), generator=g)
    keep = torch.ones(16, 6, dtype=torch.bool)
    if hide_row is not None:
        keep[hide_row] = False
    return tokens, keep, labels


def lightning_fit(callback, sanity_steps: int, hide_row: int | None = 5,
                  optimizers=lambda params: torch.optim.AdamW(params, lr=1e-2), train_batch: int = 4, **options):
    """Lightning's fit of the Attention model; `optimizers(parameters)` is configure_optimizers' value, `options`
    more pl.Trainer arguments (max_epochs 2 unless given)."""
    pl = pytest.importorskip("lightning.pytorch")

    class Lit(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = Attention()

        def training_step(self, batch, i):
            tokens, keep, labels = batch
            return F.cross_entropy(self.net(tokens, keep), labels)

        def validation_step(self, batch, i):
            tokens, keep, labels = batch
            self.log("val_loss", F.cross_entropy(self.net(tokens, keep), labels))

        def configure_optimizers(self):
            return optimizers(self.parameters())

    torch.manual_seed(0)
    train = DataLoader(TensorDataset(*data(None)), batch_size=train_batch)
    val = DataLoader(TensorDataset(*data(hide_row)), batch_size=4)
    trainer = pl.Trainer(**{"max_epochs": 2, **options}, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, accelerator="cpu",
                         num_sanity_val_steps=sanity_steps, callbacks=[callback])
    trainer.fit(Lit(), train, val)
    return trainer


def _assert_masked_softmax(finding, step: int, batch: int):
    assert (finding.phase, finding.step, finding.micro_step) == ("eval", step, batch)
    assert (finding.op, finding.cause, finding.source) == \
        ("aten._softmax.default", "all_masked_softmax", f"tests/e2e/frameworks/test_eval_callbacks.py:{SOFTMAX_LINE}")


def test_lightning_validation_nan_is_found_and_training_stops(tmp_path):
    from debug_nan.integrations.lightning import DebugNaNCallback

    callback = DebugNaNCallback(report=str(tmp_path / "r.json"))
    trainer = lightning_fit(callback, sanity_steps=0)
    _assert_masked_softmax(callback.finding, step=4, batch=2)  # 4 steps in epoch 1; sample 5 is in batch 2
    assert callback.status == "nonfinite" and trainer.global_step == 4  # epoch 2 never trained


def test_lightning_sanity_check_nan_is_found_before_training(tmp_path):
    from debug_nan.integrations.lightning import DebugNaNCallback

    callback = DebugNaNCallback(report=str(tmp_path / "r.json"))
    trainer = lightning_fit(callback, sanity_steps=2)
    _assert_masked_softmax(callback.finding, step=0, batch=2)
    assert trainer.global_step == 0


def test_lightning_healthy_validation_stays_clean(tmp_path):
    from debug_nan.integrations.lightning import DebugNaNCallback

    callback = DebugNaNCallback(report=str(tmp_path / "r.json"))
    trainer = lightning_fit(callback, sanity_steps=2, hide_row=None)
    assert callback.status == "clean" and callback.finding is None and trainer.global_step == 8


class Classifier(Attention):
    """The HF Trainer's shape: keyword batches in, {"loss", "logits"} out."""

    def forward(self, tokens, keep, labels=None):
        logits = super().forward(tokens, keep)
        return {"loss": F.cross_entropy(logits, labels), "logits": logits}


def test_hf_trainer_evaluation_nan_is_found_and_training_stops(tmp_path):
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from debug_nan.integrations.hf import DebugNaNCallback

    def rows(hide_row):
        tokens, keep, labels = data(hide_row)
        return [{"tokens": t, "keep": k, "labels": y} for t, k, y in zip(tokens, keep, labels)]

    torch.manual_seed(0)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=4, per_device_eval_batch_size=4, max_steps=6,
        eval_strategy="steps", eval_steps=2, learning_rate=1e-2, report_to=[], save_strategy="no", use_cpu=True,
        disable_tqdm=True, seed=0, logging_steps=1000)
    trainer = transformers.Trainer(model=Classifier(), args=args, train_dataset=rows(None), eval_dataset=rows(5))
    callback = DebugNaNCallback(trainer, report=str(tmp_path / "r.json"))
    trainer.add_callback(callback)
    trainer.train()
    _assert_masked_softmax(callback.finding, step=2, batch=2)
    assert trainer.state.global_step == 2


def test_the_monitor_raises_at_a_validation_nan_outside_its_steps():
    import debug_nan

    torch.manual_seed(0)
    model = Attention()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    tokens, keep, labels = data(None)
    monitor = debug_nan.Monitor(model, lambda m, b: F.cross_entropy(m(b[0], b[1]), b[2]), optimizer)
    for i in range(3):
        batch = (tokens[4 * i:4 * i + 4], keep[4 * i:4 * i + 4], labels[4 * i:4 * i + 4])
        with monitor.step(batch):
            F.cross_entropy(model(*batch[:2]), batch[2]).backward()
        optimizer.step()
        optimizer.zero_grad()
    held_out = data(hide_row=1)
    model.eval()
    with torch.no_grad():
        model(tokens[:4], keep[:4])  # a healthy forward outside the steps: silent
        with pytest.raises(debug_nan.NonFiniteError) as raised:
            model(held_out[0][:4], held_out[1][:4])
    _assert_masked_softmax(raised.value.finding, step=3, batch=2)
    monitor.close()
    assert not model._forward_hooks and not model._forward_pre_hooks  # close() takes every hook off


def test_an_update_that_broke_the_weights_is_named_before_the_monitors_validation_reads_them():
    """The validation's first forward reads the last update's check first (as the CLI does before its eval pass):
    the NonFiniteError names the optimizer step that made the weights inf, not the validation forward."""
    import debug_nan

    torch.manual_seed(0)
    model = Attention()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    tokens, keep, labels = data(None)
    monitor = debug_nan.Monitor(model, lambda m, b: F.cross_entropy(m(b[0], b[1]), b[2]), optimizer)
    for i in range(3):
        batch = (tokens[4 * i:4 * i + 4], keep[4 * i:4 * i + 4], labels[4 * i:4 * i + 4])
        optimizer.param_groups[0]["lr"] = float("inf") if i == 2 else 0.1  # (the loop's own schedule, gone wrong)
        with monitor.step(batch):
            F.cross_entropy(model(*batch[:2]), batch[2]).backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    with torch.no_grad(), pytest.raises(debug_nan.NonFiniteError) as raised:
        model(tokens[:4], keep[:4])
    f = raised.value.finding
    assert (f.phase, f.step, f.cause) == ("optimizer", 3, "nonfinite_parameter"), f
    assert "The learning rate is inf in optimizer.param_groups[0]" in f.explanation
    monitor.close()


def test_lightning_an_update_that_broke_the_weights_is_named_before_its_validation(tmp_path):
    """A per-step schedule gone to inf after 3 steps, validation every 4 steps: step 4's update is the finding."""
    from debug_nan.integrations.lightning import DebugNaNCallback

    def optimizers(params):
        optimizer = torch.optim.SGD(params, lr=0.1)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: float("inf") if s >= 3 else 1.0)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": schedule, "interval": "step"}}

    callback = DebugNaNCallback(report=str(tmp_path / "r.json"))
    trainer = lightning_fit(callback, sanity_steps=0, hide_row=None, optimizers=optimizers, train_batch=2,
                            max_epochs=1, val_check_interval=4)
    f = callback.finding
    assert (f.phase, f.step, f.cause) == ("optimizer", 4, "nonfinite_parameter"), f
    assert "LambdaLR set it after 3 of its steps" in f.explanation
    assert callback.status == "nonfinite" and trainer.global_step == 4


def test_hf_trainer_an_update_that_broke_the_weights_is_named_before_its_evaluation(tmp_path):
    """The HF Trainer with its own optimizer and a per-step schedule gone to inf after 3 steps, evaluating every 4
    steps: step 4's update is the finding, read at the evaluation's first forward."""
    transformers = pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from debug_nan.integrations.hf import DebugNaNCallback

    def rows():
        tokens, keep, labels = data(None)
        return [{"tokens": t, "keep": k, "labels": y} for t, k, y in zip(tokens, keep, labels)]

    torch.manual_seed(0)
    model = Classifier()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: float("inf") if s >= 3 else 1.0)
    args = transformers.TrainingArguments(
        output_dir=str(tmp_path / "out"), per_device_train_batch_size=2, per_device_eval_batch_size=4, max_steps=6,
        eval_strategy="steps", eval_steps=4, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
        seed=0, logging_steps=1000)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=rows(), eval_dataset=rows(),
                                   optimizers=(optimizer, schedule))
    callback = DebugNaNCallback(trainer, report=str(tmp_path / "r.json"))
    trainer.add_callback(callback)
    trainer.train()
    f = callback.finding
    assert (f.phase, f.step, f.cause) == ("optimizer", 4, "nonfinite_parameter"), f
    assert trainer.state.global_step == 4
