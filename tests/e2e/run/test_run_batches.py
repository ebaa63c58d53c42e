"""`debug-nan run` on a script whose batches are not dicts: transformers' BatchEncoding (a Mapping, no dict) is
copied for the replay and checked as data, so a NaN in one of its tensors is a data finding naming the key."""

import pytest

from tests.support.run.script_runs import tripped

# a DataLoader whose collate_fn returns a BatchEncoding, as a tokenizer's does; the model takes the whole batch.
# Sample 21 (batch 6: step 6, batch size 4) carries a NaN in its `inputs_embeds`, as an upstream feature
# extractor's bad row would
BATCH_ENCODING = """import torch
from torch import nn
from torch.utils.data import DataLoader
from transformers import BatchEncoding


class Reader(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Linear(8, 8), nn.Linear(8, 1)

    def forward(self, batch):
        hidden = self.embed(batch["inputs_embeds"]) * batch["attention_mask"].unsqueeze(-1)
        return self.head(hidden.mean(dim=1)).squeeze(-1)


def collate(rows):
    embeds = torch.stack([r[0] for r in rows])
    return BatchEncoding({"inputs_embeds": embeds, "attention_mask": torch.ones(embeds.shape[:2]),
                          "labels": torch.stack([r[1] for r in rows])})


torch.manual_seed(0)
rows = [(torch.randn(5, 8), torch.randn(())) for _ in range(32)]
rows[21][0][2, 3] = float("nan")
model = Reader()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step, batch in enumerate(DataLoader(rows, batch_size=4, collate_fn=collate), 1):
    loss = (model(batch) - batch["labels"]).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
"""


def test_a_nan_in_a_batch_encoding_is_a_data_finding_naming_its_key(tmp_path, run_here):
    pytest.importorskip("transformers")
    first, stdout, _ = tripped(run_here, tmp_path, BATCH_ENCODING, "train.py")
    assert (first["step"], first["micro_step"], first["phase"], first["cause"], first["detected_by"]) == \
        (6, 1, "data", "nonfinite_input", "data check"), first
    assert "key `inputs_embeds` [4, 5, 8] holds 1 NaN and 0 Inf of 160 values, at positions [[1, 2, 3]]" in \
        first["explanation"]
    assert stdout.splitlines()[-1].startswith("step 5 loss ")  # the script ran its five finite steps as it does


# the model takes one tensor: the batch has no key of its own
LONE_TENSOR = """import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
for step in range(1, 6):
    x = torch.randn(4, 8)
    if step == 4:
        x[0, 0] = float("inf")
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def test_a_lone_batch_tensor_is_named_as_the_batch(tmp_path, run_here):
    first, _, log = tripped(run_here, tmp_path, LONE_TENSOR, "train.py")
    assert (first["step"], first["phase"], first["cause"]) == (4, "data", "nonfinite_input"), first
    assert first["watch"] == "data `<batch>`" and "the batch tensor [4, 8] holds 0 NaN and 1 Inf" in \
        first["explanation"]
    assert "TRIP at step 4, micro-batch 1: data check of `<batch>` read inf" in log
