"""torch.compile under debug-nan: its hooks stay out of the user's compiled graph (the watch's return at once
while dynamo traces, the root pre-hook of `run` runs eagerly), so dynamo neither traces nor warns about them."""

import pytest
import torch
from torch._dynamo.utils import counters

from debug_nan.checks.watch import Watch
from tests.run.script_runs import alone, watched, write
from debug_nan.torch_support import compile_supported

pytestmark = pytest.mark.skipif(not compile_supported(), reason="torch.compile needs torch >= 2.6 on Python 3.13 "
                                "(torch_support.compile_supported)")

COMPILED = """
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    fast = torch.compile(model)  # after the optimizer: the root debug-nan hooks is the eager model, inside the graph
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for step in range(4):
        loss = torch.nn.functional.mse_loss(fast(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(step, f"{loss.item():.5f}")
"""


@pytest.mark.e2e
def test_a_compiled_model_runs_as_alone_and_dynamo_never_sees_debug_nan(tmp_path):
    script = write(tmp_path, COMPILED)
    plain = alone(script)
    done, report = watched(script)
    assert plain.returncode == 0 and done.returncode == 0, done.stderr
    assert done.stdout == plain.stdout and plain.stdout.count("\n") == 4
    assert (report["status"], report["steps_run"]) == ("clean", 4)
    assert "perf_counter" not in done.stderr and "Dynamo" not in done.stderr


def test_the_watch_leaves_one_graph_without_breaks():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    watch = Watch(model)
    torch._dynamo.reset()
    counters.clear()
    torch.compile(model, backend="eager")(torch.ones(2, 8)).sum().backward()
    assert counters["stats"]["unique_graphs"] == 1 and not counters["graph_break"]
    assert watch._modules == []  # nothing measured inside the graph
    model(torch.ones(2, 8))
    assert len(watch._modules) == 3  # eagerly, the hooked modules: both Linear and the root
    watch.close()
