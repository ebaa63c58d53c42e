"""A rank of `torchrun -m debug_nan run -- SCRIPT` killed by a fatal signal (here the script's own os.abort() on
rank 1, after it trained) prints its Python stack before it dies: torchrun alone says only "exitcode: -6"."""

from tests.e2e.ddp.test_run_ddp import torchrun

SCRIPT = """\
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
torch.manual_seed(0)
model = DistributedDataParallel(torch.nn.Linear(4, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(2):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
if dist.get_rank() == 1:
    os.abort()
dist.destroy_process_group()
"""


def test_a_rank_killed_by_sigabrt_prints_where_it_was(tmp_path):
    (tmp_path / "aborts.py").write_text(SCRIPT)
    done = torchrun("-m", "debug_nan", "run", "--", "aborts.py", cwd=tmp_path)
    assert done.returncode != 0
    assert "Fatal Python error: Aborted" in done.stderr, done.stderr[-3000:]
    assert 'aborts.py", line 16 in <module>' in done.stderr
