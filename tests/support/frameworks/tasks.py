"""The tiny models of the integration tests, as `--task` plug-ins: the same model, batches, loss and optimizer
that the Lightning / HF tests train, so the CLI's finding can be compared with the callback's.

    debug-nan --task tests/support/frameworks/tasks.py:masked_attention --max-steps 5 --max-grad-norm 0 --warmup-steps 0
"""

import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn

ROOT = str(Path(__file__).resolve().parents[3])  # the repository: a --task file is loaded by path, maybe elsewhere
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# the masked-attention net, its batches and its loss: tests/support/models.py
from tests.support.models import D, Net  # noqa: E402
from tests.support.models import batches as masked_batches  # noqa: E402
from tests.support.models import regression_loss as net_loss  # noqa: E402

LR = 1e-2


def optimizer(params):
    return torch.optim.AdamW(params, lr=LR)


def _task(empty_at):
    torch.manual_seed(0)
    return SimpleNamespace(model=Net(), batches=masked_batches(empty_at=empty_at), loss=net_loss, optimizer=optimizer)


def healthy():
    return _task(())


def masked_attention():
    """Batch 3 (0-based) has an all-masked sample: step 4 without accumulation, step 2 micro-batch 2 with 2."""
    return _task((3,))


def net_loss_refusing_nan(model, batch):
    """A training loop's own NaN check: raises instead of returning a NaN loss."""
    pred = model(batch["x"], batch["valid"])
    if torch.isnan(pred).any():
        raise ValueError(f"NaN in the predictions {tuple(pred.shape)}")
    return ((pred - batch["y"]) ** 2 * batch["valid"]).sum() / batch["valid"].sum().clamp_min(1)


class Wide(nn.Module):
    """Healthy in fp16 (gradients ~1), but the initial loss scale 65536 pushes the scaled gradients past 65504:
    a GradScaler skips those steps and lowers the scale (expected, no finding)."""

    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(D, 64)
        self.out = nn.Linear(64, 1)
        with torch.no_grad():
            self.out.weight.fill_(0.3)

    def forward(self, x):
        return self.out(self.inp(x))


def sum_loss(model, batch):
    return model(batch["x"]).sum()


def plain_batches(n=4, seed=10):
    g = torch.Generator().manual_seed(seed)
    return [{"x": torch.randn(8, D, generator=g), "y": torch.randn(8, generator=g)} for _ in range(n)]


class Distances(nn.Module):
    """Pairwise distances through sqrt, 0 on the diagonal: finite forward, NaN gradient at any loss scale."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(D, D)

    def forward(self, x):
        z = self.proj(x)
        return torch.sqrt(((z[:, None, :] - z[None, :, :]) ** 2).sum(-1))


def distance_loss(model, batch):
    d = model(batch["x"])
    return ((d.float() - 1.0) ** 2).mean()  # in float32, as a loss should be under fp16 autocast


def mse_loss(model, batch):
    return ((model(batch["x"]).reshape(-1) - batch["y"]) ** 2).mean()


# -- a tiny BERT for the HF Trainer tests ---------------------------------------------------------------------
VOCAB, SEQ, HF_BATCH = 50, 8, 2


def tiny_bert():
    """BertForMaskedLM from a config (hidden 32, 2 layers, 2 heads): no download."""
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=16)
    return BertForMaskedLM(config)


def mlm_samples(n=16, unlabelled=(), seed=1):
    """n samples {input_ids [SEQ], attention_mask [SEQ], labels [SEQ]}: 3 labelled positions each, except the
    samples in `unlabelled`, which have none (all labels -100)."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        ids = torch.randint(5, VOCAB, (SEQ,), generator=g)
        labels = torch.full((SEQ,), -100)
        if i not in unlabelled:
            where = torch.randperm(SEQ, generator=g)[:3]
            labels[where] = ids[where]
        out.append({"input_ids": ids, "attention_mask": torch.ones(SEQ, dtype=torch.long), "labels": labels})
    return out


def per_sequence_loss(outputs, labels, num_items_in_batch=None):
    """Mean over sequences of each sequence's mean token loss (an HF `compute_loss_func`). The bug: a sequence
    without labelled tokens divides 0 by 0."""
    logits = outputs["logits"] if isinstance(outputs, dict) else outputs[0]
    ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
    counted = (labels != -100).float()
    return ((ce * counted).sum(-1) / counted.sum(-1)).mean()


def hf_batches(samples):
    """The Trainer's micro-batches: samples in order (train_sampling_strategy="sequential"), HF_BATCH each."""
    return [{k: torch.stack([s[k] for s in samples[i:i + HF_BATCH]]) for k in samples[0]}
            for i in range(0, len(samples), HF_BATCH)]


def _hf_task(unlabelled):
    def loss(model, batch):
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
        return per_sequence_loss(out, batch["labels"])

    return SimpleNamespace(model=tiny_bert(), batches=hf_batches(mlm_samples(unlabelled=unlabelled)), loss=loss,
                           optimizer=lambda params: torch.optim.AdamW(params, lr=LR, weight_decay=0.0))


def bert_healthy():
    return _hf_task(())


def bert_unlabelled_sequence():
    """Sample 7 has no labelled token: micro-batch 4 (0-based 3) -> step 4, or step 2 micro-batch 2 with 2."""
    return _hf_task((7,))


class Norms(nn.Module):
    """Per-sample norms of a scaled input: a sample that is all zeros has a finite norm 0 but a NaN gradient
    (d sqrt(s) / ds is infinite at 0). x [B, D] -> [B]."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(D))

    def forward(self, x):
        return torch.sqrt(((x * self.scale) ** 2).sum(-1))


def norms_loss(model, batch):
    return ((model(batch["x"]) - batch["y"]) ** 2).mean()


def norm_batches(n=8, zero_at=(), seed=12):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n):
        x = torch.randn(4, D, generator=g)
        if i in zero_at:
            x[1] = 0.0
        out.append({"x": x, "y": torch.rand(4, generator=g)})
    return out
