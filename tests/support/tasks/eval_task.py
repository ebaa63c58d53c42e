"""--task plug-ins with a validation pass: a user's own nn.TransformerEncoder whose padded batches meet torch's
inference fast path only in eval() + no_grad (tests/e2e/cli/test_eval.py)."""

import torch
from torch import nn


class Tagger(nn.Module):
    """tokens [B, L] (0 = padding) -> logits [B, L, 4] through nn.TransformerEncoder."""

    def __init__(self, norm_first: bool):
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(8, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True, norm_first=norm_first)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=not norm_first)
        self.head = nn.Linear(16, 4)
        self.frozen = nn.Dropout(0.5)
        self.frozen.eval()  # a submodule the task keeps in eval mode: the eval pass must give it back as it was

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens), src_key_padding_mask=tokens.eq(0)))


def _batch(seed: int, empty_row: bool) -> dict:
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(1, 8, (4, 6), generator=g)
    tokens[1, 4:] = 0
    if empty_row:
        tokens[2] = 0  # a sequence that is all padding (an empty document, a filtered sample)
    return {"tokens": tokens, "labels": torch.randint(0, 4, (4, 6), generator=g)}


def loss(model, batch):
    logits = model(batch["tokens"])
    keep = batch["tokens"].ne(0)
    return nn.functional.cross_entropy(logits[keep], batch["labels"][keep])


def evaluate(model, batch):
    """Metrics and the predictions the user's validation reads."""
    logits = model(batch["tokens"])
    return {"loss": loss(model, batch), "logits": logits,
            "accuracy": (logits.argmax(-1) == batch["labels"]).float().mean()}


def _task(norm_first: bool) -> dict:
    return {"model": Tagger(norm_first), "batches": [_batch(i, empty_row=False) for i in range(4)], "loss": loss,
            "eval_batches": [_batch(100, empty_row=False), _batch(101, empty_row=True)], "evaluate": evaluate}


def pre_norm():
    """norm_first=True: no nested tensors, the padded fused kernel, which gives the empty row NaN."""
    return _task(norm_first=True)


def post_norm():
    """norm_first=False with nested tensors: the empty row is dropped and comes back as zeros."""
    return _task(norm_first=False)


def without_eval_batches():
    return {k: v for k, v in _task(True).items() if k not in ("eval_batches", "evaluate")}
