"""The talk between the ranks of `debug-nan run` under torchrun (drivers/run/ranks.py), in one process: the other rank's
side is written into the store by hand. (tests/e2e/ddp/test_run_ddp.py runs them.)"""

import pytest
import torch.distributed as dist

from debug_nan.drivers.run.ranks import Ranks, RanksUnanswered
from debug_nan.engine.session.distributed import DistContext


def ranks(rank: int = 0, world: int = 2) -> Ranks:
    r = Ranks(DistContext(rank, world, rank))
    r.store = dist.HashStore()
    return r


def test_exchange_returns_every_rank_value_in_rank_order():
    r = ranks(rank=1)
    r.store.set("1-leave/0", "3")  # rank 0 posted first
    assert r.exchange("leave", "1") == ["3", "1"]
    assert r.store.get("1-leave/1") == b"1"


def test_exchange_names_the_rank_that_never_answered():
    r = ranks(rank=0, world=3)
    r.store.set("1-leave/2", "0")
    with pytest.raises(RanksUnanswered, match=r"rank\(s\) 1 did not reach `leave` within 0 s"):
        r.exchange("leave", "0", timeout_s=0.05)
