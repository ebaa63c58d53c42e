"""The watch under two gloo ranks (mp.spawn): an overflowed norm is settled by both ranks together."""

import math

import torch
from torch import nn

from debug_nan.engine.watch.phase_codes import PHASE_CODE
from debug_nan.engine.watch.watch import Watch


def _two_rank_sync(rank: int, init_file: str, results) -> None:
    """Rank 1's gradient norm overflows (finite elements, then a real Inf); rank 0 is clean."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=2)
    try:
        def agree(code):
            codes = torch.zeros(2)
            codes[rank] = code
            dist.all_reduce(codes, op=dist.ReduceOp.MAX)
            return codes

        model = nn.Linear(4, 1, bias=False)
        watch = Watch(model)
        out = []
        for element in (3e37, math.inf):
            model.weight.grad = torch.full((1, 4), element if rank == 1 else 1.0)
            watch.watch_grads()
            out.append(watch.sync(agree).rank_codes)
        results[rank] = out
    finally:
        dist.destroy_process_group()
    import os

    os._exit(0)  # no interpreter teardown: see tests/e2e/ddp/test_overlap.py (a gloo thread's abort at exit)


def test_two_ranks_settle_an_overflowed_norm_together(tmp_path):
    import torch.multiprocessing as mp

    with mp.Manager() as manager:
        results = manager.dict()
        mp.spawn(_two_rank_sync, args=(str(tmp_path / "init"), results), nprocs=2, join=True)
        results = dict(results)
    grad = float(PHASE_CODE["grad"])
    assert results[0] == results[1] == [[0.0, 0.0], [0.0, grad]]
