"""The watch's overhead inside PyTorch Lightning and the HF Trainer: the same run with and without the callback.

    python scripts/bench_integrations.py [--device cpu] [--model bert|deep|gpt2]
                                         [--hidden 128 --layers 4 --seq 128 --batch 8]  (bert's size)
                                         [--steps 30 --warmup 16 --repeats 5] [--accumulate 1] [--threads 1]
                                         [--precision fp32|bf16|fp16] [--json out.json]

For each framework, the same model trains --steps optimizer steps: BertForMaskedLM (built from a config: no
download), or the deep-narrow / GPT-2-like presets of scripts/bench_models.py (whose batch and sequence length
they fix),
plain and with DebugNaNCallback, alternately (plain first in even pairs, watched first in odd ones), --repeats
pairs. A timing callback measures the steps after --warmup (setup, first-step allocations and the framework's
start-up excluded). Reported: median ms per optimizer step of each, and the median of the per-pair ratios.
On the CPU, --threads (default 1) keeps the pairs comparable on a shared machine. The default --warmup 16 times
the steady state: the watch measures every module output in a run's first 16 steps, then, on the CPU, on a stride
that keeps that measurement at 0.5% of a step (debug_nan/engine/session/output_schedule.py; --warmup 2 times those first
steps).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_models import PRESETS, TinyGPT, lm_loss  # noqa: E402


class PresetLM(torch.nn.Module):
    """A bench_models preset that returns its loss, as a transformers model does: {"loss": ...}."""

    def __init__(self, name: str):
        super().__init__()
        torch.manual_seed(0)
        self.lm = TinyGPT(PRESETS[name])

    def forward(self, idx, targets):
        return {"loss": lm_loss(self.lm, {"idx": idx, "targets": targets})}


def make_model(a):
    if a.model != "bert":
        return PresetLM(a.model)
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    return BertForMaskedLM(BertConfig(vocab_size=1000, hidden_size=a.hidden, num_hidden_layers=a.layers,
                                      num_attention_heads=max(1, a.hidden // 32), intermediate_size=4 * a.hidden,
                                      max_position_embeddings=a.seq))


def samples(a) -> list[dict]:
    g = torch.Generator().manual_seed(0)
    n = a.batch * a.accumulate * (a.steps + 1)
    if a.model != "bert":
        vocab = PRESETS[a.model].vocab
        tokens = torch.randint(0, vocab, (n, a.seq + 1), generator=g)
        return [{"idx": t[:-1], "targets": t[1:]} for t in tokens]
    ids = torch.randint(5, 1000, (n, a.seq), generator=g)
    labels = torch.where(torch.rand(n, a.seq, generator=g) < 0.15, ids, torch.full_like(ids, -100))
    return [{"input_ids": i, "attention_mask": torch.ones(a.seq, dtype=torch.long), "labels": y}
            for i, y in zip(ids, labels)]


def run_lightning(a, watched: bool) -> float:
    """Seconds per optimizer step after the warm-up, one Lightning fit."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, default_collate

    from debug_nan.integrations.lightning import DebugNaNCallback

    class Lit(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = make_model(a)

        def training_step(self, batch, batch_idx):
            return self.model(**batch)["loss"]

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    class Clock(pl.Callback):
        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            if trainer.global_step == a.warmup and batch_idx % a.accumulate == 0 and not hasattr(self, "t0"):
                _sync(a.device)
                self.t0 = time.perf_counter()

        def on_train_end(self, trainer, module):
            _sync(a.device)
            self.t1 = time.perf_counter()

    clock = Clock()
    callbacks = [clock] + ([DebugNaNCallback(bundle=False)] if watched else [])
    trainer = pl.Trainer(accelerator="gpu" if a.device.startswith("cuda") else "cpu", devices=1,
                         max_steps=a.steps, accumulate_grad_batches=a.accumulate, precision=a.lightning_precision,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=callbacks)
    trainer.fit(Lit(), DataLoader(samples(a), batch_size=a.batch, collate_fn=default_collate))
    return (clock.t1 - clock.t0) / (a.steps - a.warmup)


def run_hf(a, watched: bool) -> float:
    """Seconds per optimizer step after the warm-up, one HF Trainer.train()."""
    import transformers

    from debug_nan.integrations.hf import DebugNaNCallback

    class Clock(transformers.TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == a.warmup and not hasattr(self, "t0"):
                _sync(a.device)
                self.t0 = time.perf_counter()

        def on_train_end(self, args, state, control, **kwargs):
            _sync(a.device)
            self.t1 = time.perf_counter()

    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, per_device_train_batch_size=a.batch, gradient_accumulation_steps=a.accumulate,
            max_steps=a.steps, learning_rate=1e-4, report_to=[], save_strategy="no", logging_strategy="no",
            use_cpu=not a.device.startswith("cuda"), disable_tqdm=True, seed=0, bf16=a.precision == "bf16",
            fp16=a.precision == "fp16")
        trainer = transformers.Trainer(model=make_model(a), args=args, train_dataset=samples(a))
        clock = Clock()
        trainer.add_callback(clock)
        if watched:
            trainer.add_callback(DebugNaNCallback(trainer, bundle=False))
        trainer.train()
    return (clock.t1 - clock.t0) / (a.steps - a.warmup)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def measure(run, a) -> dict:
    plain, watched, ratios = [], [], []
    for r in range(a.repeats):
        pair = {}
        for mode in ((False, True) if r % 2 == 0 else (True, False)):
            pair[mode] = run(a, mode)
        plain.append(pair[False])
        watched.append(pair[True])
        ratios.append(pair[True] / pair[False])
    return {"plain_ms_per_step": 1e3 * statistics.median(plain),
            "watched_ms_per_step": 1e3 * statistics.median(watched), "median_ratio": statistics.median(ratios),
            "ratios": ratios}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--model", choices=("bert", *PRESETS), default="bert")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--accumulate", type=int, default=1)
    ap.add_argument("--precision", choices=("fp32", "bf16", "fp16"), default="fp32")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--frameworks", default="lightning,hf")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if not 0 <= a.warmup < a.steps:
        ap.error("--warmup must be in 0 .. --steps - 1")
    if a.model != "bert":  # the preset fixes its batch and sequence length
        a.batch, a.seq = PRESETS[a.model].batch, PRESETS[a.model].seq
    torch.set_num_threads(a.threads)
    a.lightning_precision = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}[a.precision]
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "transformers"):
        logging.getLogger(name).setLevel(logging.ERROR)
    runs = {"lightning": run_lightning, "hf": run_hf}
    results = {}
    for name in a.frameworks.split(","):
        results[name] = measure(runs[name], a)
    device = torch.cuda.get_device_name() if a.device.startswith("cuda") else f"cpu ({torch.get_num_threads()} threads)"
    what = f"BertForMaskedLM hidden {a.hidden} x {a.layers} layers" if a.model == "bert" else f"preset {a.model}"
    print(f"\nwatch overhead, {what}, batch {a.batch} x seq {a.seq}, "
          f"accumulation {a.accumulate}, {a.precision}, {device}; median of {a.repeats} interleaved pairs")
    print(f"{'framework':<12}{'plain ms/step':>15}{'watched ms/step':>17}{'ratio':>8}")
    for name, r in results.items():
        print(f"{name:<12}{r['plain_ms_per_step']:>15.1f}{r['watched_ms_per_step']:>17.1f}{r['median_ratio']:>8.3f}")
    if a.json:
        config = {k: v for k, v in vars(a).items() if k != "json"}
        Path(a.json).write_text(json.dumps({"device": device, "config": config, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
