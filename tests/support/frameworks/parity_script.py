"""A user's own training script on the parity GPT-2 (no debug-nan inside), for `debug-nan run`: the same model,
batches and optimizer as parity.py's planted bugs, trained by a plain loop, Lightning or the HF Trainer.

    python parity_script.py plain|lightning|hf BUG OUTPUT_DIR

Prints the last loss; exits 0 (a NaN loss is printed as nan, as an unwatched script would).
"""

import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root, for the test models

from tests.support.frameworks import parity  # noqa: E402

framework, bug, out = sys.argv[1], sys.argv[2], sys.argv[3]
steps, accumulate = parity.BUGS.get(bug, (3, 1))
model, batches, make_optimizer = parity.build(bug)

if framework == "plain":
    optimizer = make_optimizer(model.parameters())
    stream = itertools.cycle(batches)
    for _ in range(steps):
        for _ in range(accumulate):
            loss = parity.lm_loss(model, next(stream))
            (loss / accumulate).backward()
        optimizer.step()
        optimizer.zero_grad()
    print(f"last loss {loss.item():.6f}")
elif framework == "lightning":
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, accumulate_grad_batches=accumulate,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False)
    trainer.fit(parity.lightning_module(model, make_optimizer), DataLoader(batches, batch_size=None))
    print(f"trained {trainer.global_step} steps")
else:
    import transformers

    samples = [{key: value[i] for key, value in batch.items()} for batch in batches for i in range(parity.BATCH)]
    optimizer = make_optimizer(model.parameters())
    constant = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    args = transformers.TrainingArguments(
        output_dir=out, per_device_train_batch_size=parity.BATCH, gradient_accumulation_steps=accumulate,
        max_steps=steps, max_grad_norm=0.0, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
        seed=0, train_sampling_strategy="sequential", logging_steps=1000)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=samples, optimizers=(optimizer, constant))
    trainer.train()
    print(f"trained {trainer.state.global_step} steps")
