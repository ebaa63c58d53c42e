"""An HF Trainer script, as a user writes it (no debug-nan inside): a tiny BERT from a config, masked-LM samples,
a per-sequence loss (`compute_loss_func`); prints the final training loss.

    python hf_script.py OUTPUT_DIR [--bug none|unlabelled] [--accumulate N] [--steps N]
"""

import argparse
import sys
from pathlib import Path

import transformers
from transformers.trainer_callback import PrinterCallback

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root, for its test models

from tests.support.frameworks import tasks

parser = argparse.ArgumentParser()
parser.add_argument("output_dir")
parser.add_argument("--bug", default="none", choices=["none", "unlabelled"])
parser.add_argument("--accumulate", type=int, default=1)
parser.add_argument("--steps", type=int, default=6)
args = parser.parse_args()

samples = tasks.mlm_samples(unlabelled=(7,) if args.bug == "unlabelled" else ())
training = transformers.TrainingArguments(
    output_dir=args.output_dir, per_device_train_batch_size=tasks.HF_BATCH, max_steps=args.steps,
    gradient_accumulation_steps=args.accumulate, learning_rate=tasks.LR, weight_decay=0.0, report_to=[],
    save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0, train_sampling_strategy="sequential",
    logging_steps=1000)
trainer = transformers.Trainer(model=tasks.tiny_bert(), args=training, train_dataset=samples,
                               compute_loss_func=tasks.per_sequence_loss)
trainer.remove_callback(PrinterCallback)  # its log holds the run time, which differs from run to run
result = trainer.train()
print(f"trained {result.global_step} steps, loss {result.training_loss:.6f}")
