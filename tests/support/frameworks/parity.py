"""Planted bugs on one tiny GPT-2 (transformers, built from a config: no download), as `--task` plug-ins and as
the pieces the Monitor, Lightning and HF Trainer parity runs train with: the same model, batches, loss and
optimizer through every entry point.

    debug-nan --task tests/support/frameworks/parity.py:explosion_by_lr --max-steps 4

Every batch is a dict of GPT2LMHeadModel keyword arguments: `input_ids` [B, L] or `inputs_embeds` [B, L, D], and
`labels` [B, L] (-100 = ignored). Dropout is off, so every entry point computes the same numbers.
"""

from types import SimpleNamespace

import torch

VOCAB, SEQ, BATCH, D = 32, 8, 2, 16
LR = 1e-3

# name -> (steps to run, gradient accumulation); the expected finding of each is derived in test_parity.py
BUGS = {
    "explosion_by_lr": (4, 1),
    "every_label_ignored": (4, 1),
    "overflow_by_scaled_weight": (3, 1),
    "nan_batch": (4, 1),
    "optimizer_divides_by_zero": (3, 1),
    "overflow_at_micro_2_of_2": (3, 2),
    "eval_labels_ignored": (3, 1),
    "second_optimizer_divides_by_zero": (3, 1),
    "bf16_labels_ignored": (4, 1),
}
# the mixed-precision row: a bug trained in bf16 autocast at every entry point (--precision bf16, the Monitor's loop
# in torch.autocast, precision="bf16-mixed", TrainingArguments(bf16=True), the script's torch.autocast) -> the
# planted bug it trains, as build() plants it
MIXED = {"bf16_labels_ignored": "every_label_ignored", "bf16_healthy": "healthy"}
EVAL_AFTER = 2  # the held-out pass runs after this step (every entry point that evaluates)
TWO_OPTIMIZER_BUGS = ("second_optimizer_divides_by_zero",)  # only `debug-nan run` trains with several optimizers


def gpt2():
    """GPT2LMHeadModel(n_embd 16, 2 layers, 2 heads, vocab 32, 16 positions), seeded, dropout off."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=16, n_embd=D, n_layer=2, n_head=2, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0)
    return GPT2LMHeadModel(config)


def token_batches(n=8, seed=1):
    """n micro-batches {input_ids [BATCH, SEQ], labels [BATCH, SEQ]} (labels = the ids: causal LM)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        out.append({"input_ids": ids, "labels": ids.clone()})
    return out


def embed_batches(n=8, seed=2):
    """n micro-batches {inputs_embeds [BATCH, SEQ, D], labels [BATCH, SEQ]}."""
    g = torch.Generator().manual_seed(seed)
    return [{"inputs_embeds": torch.randn(BATCH, SEQ, D, generator=g),
             "labels": torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)} for _ in range(n)]


def lm_loss(model, batch):
    """The model's own causal-LM loss (as a Lightning training_step or the HF Trainer computes it)."""
    return model(**batch).loss


def adamw(lr=LR, eps=1e-8):
    return lambda params: torch.optim.AdamW(params, lr=lr, eps=eps, weight_decay=0.0)


def autocast(name):
    """The autocast region a planted bug trains in: bf16 on the CPU for the mixed-precision row, else none."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=name in MIXED)


def build(name):
    """(model, batches, optimizer factory) of a planted bug."""
    name = MIXED.get(name, name)
    model, batches, optimizer = gpt2(), token_batches(), adamw()
    if name == "healthy":  # the control: nothing planted, must stay clean everywhere
        pass
    elif name == "explosion_by_lr":  # AdamW at lr 1e4: the weights jump, the gradient norm grows ~1e5x in a step
        optimizer = adamw(lr=1e4)
    elif name == "every_label_ignored":  # batch 3 (step 3) has no labelled token: the mean over 0 tokens is 0/0
        batches[2]["labels"].fill_(-100)
    elif name == "overflow_by_scaled_weight":  # weights scaled to +-2e38 (finite): their matmul leaves fp32's range
        with torch.no_grad():
            weight = model.transformer.h[1].mlp.c_fc.weight
            weight.copy_(weight.sign() * 2e38)
    elif name == "nan_batch":  # batch 2 (step 2) holds a NaN feature: the data itself
        batches = embed_batches()
        batches[1]["inputs_embeds"][1, 3, 5] = float("nan")
    elif name == "optimizer_divides_by_zero":  # Adam eps 0: position rows SEQ..15 never get a gradient: 0/0
        optimizer = adamw(eps=0.0)
    elif name == "overflow_at_micro_2_of_2":  # batch 4 (step 2, micro-batch 2 of 2) holds finite 1e38 features
        batches = embed_batches()
        batches[3]["inputs_embeds"][0, 2] = 1e38
    elif name in ("eval_labels_ignored", "second_optimizer_divides_by_zero"):  # training itself is healthy
        pass
    else:
        raise KeyError(name)
    return model, batches, optimizer


def held_out(name):
    """The held-out batches evaluated after step EVAL_AFTER, or None where the bug needs none. eval_labels_ignored:
    its one batch has no labelled token, so the model's own mean loss over 0 tokens is 0/0, in eval only."""
    if name != "eval_labels_ignored":
        return None
    batch = token_batches(n=1, seed=3)[0]
    batch["labels"].fill_(-100)
    return [batch]


def two_optimizers(model):
    """second_optimizer_divides_by_zero: the position embeddings under their own AdamW with eps 0 (positions SEQ..15
    never get a gradient: 0/0 in step 1's update), every other parameter under the usual AdamW."""
    positions = model.transformer.wpe.weight
    rest = [p for p in model.parameters() if p is not positions]
    return [adamw(eps=0.0)([positions]), adamw()(rest)]


def samples(batches):
    """The batches as the HF Trainer's dataset: one dict per sample."""
    return [{key: value[i] for key, value in batch.items()} for batch in batches for i in range(BATCH)]


def evaluate(model, batches):
    """The held-out pass as a user writes it: eval mode, no_grad, the model's own loss -> the mean."""
    model.eval()
    with torch.no_grad():
        losses = [lm_loss(model, batch) for batch in batches]
    model.train()
    return sum(losses) / len(losses)


def lightning_module(model, make_optimizer, make_scheduler=None):
    """A LightningModule holding `model` as `model`, whose training_step is lm_loss (Lightning imported here: the
    `--task` plug-ins above do not need it); `make_scheduler(optimizer)`: a schedule stepped every step."""
    import lightning.pytorch as pl

    class Lit(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = model

        def training_step(self, batch, batch_idx):
            return lm_loss(self.model, batch)

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", lm_loss(self.model, batch))

        def configure_optimizers(self):
            optimizer = make_optimizer(self.model.parameters())
            if make_scheduler is None:
                return optimizer
            return {"optimizer": optimizer,
                    "lr_scheduler": {"scheduler": make_scheduler(optimizer), "interval": "step"}}

    return Lit()


def _task(name):
    def make():
        model, batches, optimizer = build(name)
        return SimpleNamespace(model=model, batches=batches, loss=lm_loss, optimizer=optimizer,
                               eval_batches=held_out(name))

    make.__name__ = name
    return make


for _name in [*BUGS, "healthy", "bf16_healthy"]:
    globals()[_name] = _task(_name)
