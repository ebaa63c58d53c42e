"""The history stays bounded on long runs: every step's scalars, per-layer values for the recent steps and a
thinning stride of older ones (memory and its JSON). (The CLI's report of such a run:
tests/e2e/cli/test_history_bounded.py.)"""

import json

from debug_nan.engine.watch.history import RECENT_STEPS, SPARSE_STEPS, History
from tests.unit.engine.watch.test_history import result, run

MODULES = {f"blocks.{i}.{part}": (-1.0, 2.0) for i in range(59) for part in ("attn", "mlp", "ln1", "ln2", "drop")}
GRADS = {f"blocks.{i}.w{j}": 0.5 for i in range(59) for j in range(4)}


def test_a_thousand_steps_of_295_modules_keep_about_200_steps_per_layer():
    h = History()
    run(h, range(1, 1001), lambda s: result(MODULES, loss=1.0 / s, grads=GRADS))
    assert len(MODULES) == 295 and len(h.steps) == 1000
    layered = [r.step for r in h.steps if r.per_layer]
    assert layered[-RECENT_STEPS:] == list(range(901, 1001))  # the recent window, whole
    older = layered[:-RECENT_STEPS]
    assert h.stride == 16 and older == list(range(16, 901, 16)) and len(older) <= SPARSE_STEPS
    assert all(r.activations == {} and r.grad_norms == {} for r in h.steps if not r.per_layer)
    data = h.to_dict()
    assert [d["loss"] for d in data] == [1.0 / s for s in range(1, 1001)]  # every step's scalars
    assert "max_abs_activation" not in data[0] and len(data[15]["max_abs_activation"]) == 295
    size = len(json.dumps(data))
    assert size < 2_500_000  # kept whole, the same history is 11.7 MB (12 KiB per step)
    assert "last 100 steps and every 16th step before them" in h.kept()


def test_short_runs_keep_everything():
    h = History()
    run(h, range(1, RECENT_STEPS + 1), lambda s: result(MODULES, grads=GRADS))
    assert all(r.per_layer for r in h.steps) and h.kept() == "every step's values, per layer too"
