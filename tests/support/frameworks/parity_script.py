"""A user's own training script on the parity GPT-2 (no debug-nan inside), for `debug-nan run`: the same model,
batches and optimizer as parity.py's planted bugs, trained by a plain loop, Lightning or the HF Trainer.

    python parity_script.py plain|lightning|hf BUG OUTPUT_DIR
    torchrun --nproc_per_node=2 parity_script.py fsdp2 BUG OUTPUT_DIR

Prints the last loss; exits 0 (a NaN loss is printed as nan, as an unwatched script would). fsdp2: the plain loop
on every rank (gloo), each GPT-2 block and the root sharded with FSDP2's `fully_shard`, every rank on the same
batches (so the planted bug is every rank's); rank 0 prints.
"""

import itertools
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository root, for the test models

from tests.support.frameworks import parity

framework, bug, out = sys.argv[1], sys.argv[2], sys.argv[3]
steps, accumulate = parity.BUGS.get(bug, (3, 1))
model, batches, make_optimizer = parity.build(bug)

held_out = parity.held_out(bug)
if framework == "fsdp2":
    import torch.distributed as dist
    from torch.distributed.fsdp import fully_shard

    dist.init_process_group("gloo")
    for block in model.transformer.h:
        fully_shard(block)
    fully_shard(model)
    optimizer = make_optimizer(model.parameters())  # (on the sharded parameters, as FSDP2 wants)
    stream = itertools.cycle(batches)
    for step in range(1, steps + 1):
        loss = parity.lm_loss(model, next(stream))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    if dist.get_rank() == 0:
        print(f"last loss {loss.item():.6f}")
    dist.destroy_process_group()
elif framework == "plain":
    optimizers = (parity.two_optimizers(model) if bug in parity.TWO_OPTIMIZER_BUGS
                  else [make_optimizer(model.parameters())])
    stream = itertools.cycle(batches)
    for step in range(1, steps + 1):
        for _ in range(accumulate):
            with parity.autocast(bug):
                loss = parity.lm_loss(model, next(stream))
            (loss / accumulate).backward()
        for optimizer in optimizers:
            optimizer.step()
        for optimizer in optimizers:
            optimizer.zero_grad()
        if held_out is not None and step == parity.EVAL_AFTER:
            print(f"step {step} held-out loss {parity.evaluate(model, held_out).item():.6f}")
    print(f"last loss {loss.item():.6f}")
elif framework == "lightning":
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, accumulate_grad_batches=accumulate,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0,
                         precision="bf16-mixed" if bug in parity.MIXED else "32-true",
                         val_check_interval=parity.EVAL_AFTER * accumulate if held_out else None)
    trainer.fit(parity.lightning_module(model, make_optimizer), DataLoader(batches, batch_size=None),
                DataLoader(held_out, batch_size=None) if held_out else None)
    print(f"trained {trainer.global_step} steps")
else:
    import transformers

    samples = parity.samples(batches)
    optimizer = make_optimizer(model.parameters())
    constant = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    evaluation = {"eval_strategy": "steps", "eval_steps": parity.EVAL_AFTER,
                  "per_device_eval_batch_size": parity.BATCH} if held_out else {}
    args = transformers.TrainingArguments(
        output_dir=out, per_device_train_batch_size=parity.BATCH, gradient_accumulation_steps=accumulate,
        max_steps=steps, max_grad_norm=0.0, report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True,
        seed=0, train_sampling_strategy="sequential", logging_steps=1000, bf16=bug in parity.MIXED, **evaluation)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=samples, optimizers=(optimizer, constant),
                                   eval_dataset=parity.samples(held_out) if held_out else None)
    trainer.train()
    print(f"trained {trainer.state.global_step} steps")
