"""The watch under torch.compile: its hooks return at once while dynamo traces, so the compiled graph is one graph
without breaks and the modules are measured when they run eagerly. (A compiled script under `debug-nan run`:
tests/e2e/run/test_run_compile.py.)"""

import pytest
import torch
from torch._dynamo.utils import counters

from debug_nan.engine.watch.watch import Watch
from debug_nan.torch_support import compile_supported

pytestmark = pytest.mark.skipif(not compile_supported(), reason="torch.compile needs torch >= 2.6 on Python 3.13 "
                                "(torch_support.compile_supported)")


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
