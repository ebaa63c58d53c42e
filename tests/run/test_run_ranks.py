"""The talk between the ranks of `debug-nan run` under torchrun (launch/ranks.py, launch/reexec.py's supervision),
in one process: the other rank's side is written into the store by hand. (tests/run/test_run_ddp.py runs them.)"""

import json
import subprocess
import sys
import time

import pytest
import torch.distributed as dist

from debug_nan.checks.finding import Finding
from debug_nan.launch import reexec
from debug_nan.launch.ranks import Ranks, RanksUnanswered, child_env
from debug_nan.train.distributed import DistContext


def ranks(rank: int = 0, world: int = 2) -> Ranks:
    r = Ranks(DistContext(rank, world, rank))
    r.store = dist.HashStore()
    return r


def finding(detected_by: str, module: str) -> Finding:
    return Finding(step=2, micro_step=1, phase="forward", module=module, module_type="Linear", op=None,
                   kind="nan", cause="unknown", explanation="", source=None, suggestions=[],
                   detected_by=detected_by)


def test_exchange_returns_every_rank_value_in_rank_order():
    r = ranks(rank=1)
    r.store.set("1-port/0", "29511")  # rank 0 posted first
    assert r.exchange("port", "") == ["29511", ""]
    assert r.store.get("1-port/1") == b""


def test_exchange_names_the_rank_that_never_answered():
    r = ranks(rank=0, world=3)
    r.store.set("1-leave/2", "0")
    with pytest.raises(RanksUnanswered, match=r"rank\(s\) 1 did not reach `leave` within 0 s"):
        r.exchange("leave", "0", timeout_s=0.05)


@pytest.mark.parametrize("other_named, expected_rank, expected_module", [
    (True, 1, "attn"),  # rank 0 saw it first too but only its watch's finding: rank 1's traced op is reported
    (False, 0, "embed"),  # neither named an op: the first of the first ranks
])
def test_the_reported_finding_is_the_first_named_one_among_the_first_ranks(other_named, expected_rank,
                                                                             expected_module):
    r = ranks(rank=0)
    theirs = finding("replay" if other_named else "watch", "attn")
    r.store.set("1-finding/1", json.dumps({"finding": theirs.to_dict(), "error": None,
                                           "lines": [["  [pinpoint] rank 1's line", None]], "named": other_named}))
    chosen, error, lines = r.agree_on_finding([0, 1], finding("watch", "embed"), None, [("  mine", "yellow")])
    assert (chosen.rank, chosen.first_ranks, chosen.module, error) == (expected_rank, [0, 1], expected_module, None)
    assert lines == ([("  [pinpoint] rank 1's line", None)] if other_named else [("  mine", "yellow")])


def test_the_children_rendezvous_on_the_agreed_port_with_rank_0_hosting_it(monkeypatch):
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", "/tmp/error.json")
    env = child_env(29555)
    assert (env["MASTER_PORT"], env["TORCHELASTIC_USE_AGENT_STORE"], env["RANK"]) == ("29555", "False", "1")
    assert "TORCHELASTIC_ERROR_FILE" not in env


def test_a_child_stranded_by_a_peer_that_ended_early_is_stopped(tmp_path, monkeypatch):
    monkeypatch.setattr(reexec, "STRANDED_GRACE_S", 0.2)
    r = ranks(rank=0)
    r.store.set("0-reexec-end/1", "early")  # rank 1's child exited before the failing micro-batch's end
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = time.monotonic()
    stopped = reexec._supervise(child, r, tmp_path / "answer.json", timeout_s=120)
    assert time.monotonic() - started < 30 and child.returncode is not None
    assert stopped.startswith("the re-execution of rank 1 ended before the failing micro-batch's end")
    assert r.store.get("0-reexec-end/0") == b"early"  # and this rank says it ended early too


def test_a_child_past_its_limit_is_stopped(tmp_path):
    r = ranks(rank=1)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    stopped = reexec._supervise(child, r, tmp_path / "answer.json", timeout_s=0.3)
    assert stopped == "the re-execution did not finish within 0 s (3x the run's time + 2 min)"


def test_a_child_that_ended_in_step_says_so(tmp_path):
    r = ranks(rank=1)
    answer = tmp_path / "answer.json"
    answer.write_text('{"untraced": true, "lockstep": true}')
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    assert reexec._supervise(child, r, answer, timeout_s=60) is None
    assert r.store.get("0-reexec-end/1") == b"lockstep"
