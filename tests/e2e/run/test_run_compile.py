"""torch.compile under debug-nan: its hooks stay out of the user's compiled graph (the watch's return at once
while dynamo traces, the root pre-hook of `run` runs eagerly), so dynamo neither traces nor warns about them."""

import pytest

from debug_nan.torch_support import compile_supported
from tests.support.run.script_runs import alone, watched, write

pytestmark = [pytest.mark.skipif(not compile_supported(), reason="torch.compile needs torch >= 2.6 on Python 3.13 "
                                 "(torch_support.compile_supported)"),
              pytest.mark.processes]  # (dynamo's warnings go to the stderr of the process, logged from its start)

COMPILED = """
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.LayerNorm(16), torch.nn.Linear(16, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    # after the optimizer: the root debug-nan hooks is the eager model, inside the graph. aot_eager: dynamo's trace
    # and AOT autograd's graphs as under inductor (what meets the hooks), without compiling C++ kernels (twice the
    # CPU time of the whole script on a fresh machine, where inductor has no cache)
    fast = torch.compile(model, backend="aot_eager")
    x, y = torch.randn(32, 8), torch.randn(32, 1)
    for step in range(4):
        loss = torch.nn.functional.mse_loss(fast(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        print(step, f"{loss.item():.5f}")
"""


def test_a_compiled_model_runs_as_alone_and_dynamo_never_sees_debug_nan(tmp_path):
    script = write(tmp_path, COMPILED)
    plain = alone(script)
    done, report = watched(script)
    assert plain.returncode == 0 and done.returncode == 0, done.stderr
    assert done.stdout == plain.stdout and plain.stdout.count("\n") == 4
    assert (report["status"], report["steps_run"]) == ("clean", 4)
    assert "perf_counter" not in done.stderr and "Dynamo" not in done.stderr
