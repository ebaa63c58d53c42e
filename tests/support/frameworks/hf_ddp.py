"""HF Trainer under torchrun with 2 CPU processes (gloo), run by test_hf_ddp.py: `torchrun ... hf_ddp.py OUT`.

The sequential sampler deals the micro-batches (samples 0-1, 2-3, ...) alternately to rank 0 and rank 1: the
unlabelled sample 7 is in micro-batch 3, rank 1's second.
"""

import sys

import transformers

from debug_nan.integrations.hf import DebugNaNCallback
from tests.support.frameworks import tasks


def main(out: str) -> None:
    args = transformers.TrainingArguments(
        output_dir=f"{out}/out", per_device_train_batch_size=tasks.HF_BATCH, max_steps=4, learning_rate=tasks.LR,
        report_to=[], save_strategy="no", use_cpu=True, disable_tqdm=True, seed=0,
        train_sampling_strategy="sequential", logging_steps=1000)
    trainer = transformers.Trainer(model=tasks.tiny_bert(), args=args, train_dataset=tasks.mlm_samples(unlabelled=(7,)),
                                   compute_loss_func=tasks.per_sequence_loss)
    callback = DebugNaNCallback(trainer, report=f"{out}/r.json")
    trainer.add_callback(callback)
    trainer.train()
    f = callback.finding
    print(f"RANK {args.process_index} status {callback.status} global_step {trainer.state.global_step} finding "
          f"{f and (f.rank, f.step, f.micro_step, f.phase, f.cause)}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
