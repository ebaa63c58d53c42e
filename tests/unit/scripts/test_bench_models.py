"""scripts/bench_models.py: the model presets have the shapes they say."""

import math
import sys

import pytest
import torch

from tests.conftest import REPO


@pytest.mark.parametrize("name, modules, logits", [("deep", 295, [8, 64, 256]), ("gpt2", 79, [4, 128, 8192])])
def test_bench_model_presets_have_their_shapes(name, modules, logits):
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        from bench_models import build_lm_task
    finally:
        sys.path.pop(0)
    task = build_lm_task(name)
    batch = task.batches[0]
    assert sum(1 for _ in task.model.modules()) == modules
    with torch.no_grad():
        assert list(task.model(batch["idx"]).shape) == logits
    assert torch.equal(batch["idx"][:, 1:], batch["targets"][:, :-1])  # next-token targets
    loss = task.loss(task.model, batch)
    assert loss.ndim == 0 and abs(loss.item() - math.log(logits[-1])) < 1.0  # about uniform at initialisation
