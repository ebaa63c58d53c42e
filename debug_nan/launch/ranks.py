"""`torchrun ... -m debug_nan run -- train.py`: this process's place among the ranks of the user's DDP job.

Every rank runs the script in-process as without torchrun. While it trains, the ranks agree on every
micro-batch's trip decision through the script's own process group (train/agreement.py RankAgreement, built
here from the group the script initialised). Outside training (before the re-execution, to pick the reported
rank, to leave together) they talk through the process group's key-value store instead of collectives: the
script may have destroyed its group while it was stopped (a `finally: dist.destroy_process_group()`), and a store
key cannot leave a rank waiting inside a collective. Every wait has a deadline and names the missing rank.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import sys
import time

import torch.distributed as dist

from debug_nan.checks.finding import Finding
from debug_nan.errors import InputError
from debug_nan.integrations import ddp
from debug_nan.train.distributed import DistContext, detect

STORE_PREFIX = "debug-nan-run"
WAIT_S = 600.0  # a rank that does not answer within this long has failed or hung: the others stop


class RanksUnanswered(Exception):
    """Some rank did not reach the point the others wait at (it failed, or hangs)."""


class Ranks:
    """rank / world of this process, and the store shared with the other ranks once the script initialised
    its process group (`adopt`)."""

    def __init__(self, ctx: DistContext):
        self.rank, self.world, self.local_rank = ctx.rank, ctx.world, ctx.local_rank
        self.store = None
        self.rounds = 0

    @classmethod
    def detect(cls) -> Ranks | None:
        ctx = detect()
        return cls(ctx) if ctx is not None else None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def adopt(self) -> DistContext:
        """At the first training forward: the script's process group (DDP needs it) -> the agreement's context;
        its store is kept for the talk outside training."""
        ctx = ddp.context()
        if ctx is None or ctx.world != self.world:
            raise InputError(f"under torchrun (WORLD_SIZE={self.world}) the script trained without an initialised "
                             f"process group of {self.world} ranks: debug-nan run watches a DDP script, which calls "
                             f"torch.distributed.init_process_group before it trains.")
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.store = dist.PrefixStore(f"{STORE_PREFIX}/{attempt}",
                                      dist.distributed_c10d._get_default_store())
        return ctx

    # -- the store -------------------------------------------------------------------------------------------
    def exchange(self, name: str, value: str, timeout_s: float = WAIT_S) -> list[str]:
        """Post this rank's `value` under `name` and wait for every rank's -> the values, by rank."""
        self.rounds += 1
        prefix = f"{self.rounds}-{name}"
        self.store.set(f"{prefix}/{self.rank}", value)
        keys = [f"{prefix}/{r}" for r in range(self.world)]
        self._wait(name, keys, timeout_s)
        return [self.store.get(k).decode() for k in keys]

    def _wait(self, name: str, keys: list[str], timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.store.check(keys):
            if time.monotonic() > deadline:
                missing = [k.rsplit("/", 1)[1] for k in keys if not self.store.check([k])]
                raise RanksUnanswered(f"rank(s) {', '.join(missing)} did not reach `{name}` within {timeout_s:.0f} "
                                      f"s (failed or hung)")
            time.sleep(0.02)

    def post(self, name: str, value: str) -> None:
        """A value the others may look at while they wait (`posted`), outside an exchange round."""
        self.store.set(f"{self.rounds}-{name}/{self.rank}", value)

    def posted(self, name: str) -> dict[int, str]:
        """The values other ranks posted under `name` in this round, so far."""
        keys = {r: f"{self.rounds}-{name}/{r}" for r in range(self.world) if r != self.rank}
        return {r: self.store.get(k).decode() for r, k in keys.items() if self.store.check([k])}

    def fresh_port(self) -> int:
        """A free port on rank 0's host, the same on every rank: where the re-executed ranks rendezvous."""
        port = ""
        if self.is_main:
            with socket.socket() as s:
                s.bind(("", 0))
                port = str(s.getsockname()[1])
        return int(self.exchange("port", port)[0])

    def agree_on_finding(self, first: list[int], finding: Finding | None, error: str | None, lines: list,
                         timeout_s: float = WAIT_S) -> tuple[Finding | None, str | None, list]:
        """Every rank's own pinpoint -> the reported one, the same on every rank: the first of the ranks that saw
        the harm first whose re-execution named the op that made it, else the first of them (train/agreement.py's
        rule).
        Returns its finding (with its rank), its error and its log lines."""
        # named: an op made the value non-finite here. A tensor that already was (`op` empty) is not: under DDP a
        # rank's gradients turn non-finite in the all-reduce that brings another rank's NaN
        named = finding is not None and finding.detected_by != "watch" and bool(finding.op)
        mine = json.dumps({"finding": finding.to_dict() if finding is not None else None, "error": error,
                           "lines": lines, "named": named})
        answers = [json.loads(a) for a in self.exchange("finding", mine, timeout_s)]
        src = next((r for r in first if answers[r]["named"]), first[0])
        chosen = answers[src]
        finding = Finding(**chosen["finding"]) if chosen["finding"] is not None else None
        if finding is not None:
            finding.rank, finding.first_ranks = src, list(first)
        return finding, chosen["error"], [tuple(line) for line in chosen["lines"]]

    # -- leaving ---------------------------------------------------------------------------------------------
    def leave(self, code: int, together: bool = True) -> None:
        """End this rank with `code`: once every rank is done when they all end at the same point (`together`:
        torchrun stops the others as soon as one exits non-zero, which could cut rank 0's report short), at once
        when this rank failed alone (the others may be waiting inside a collective: torchrun stops them). The
        script's atexit functions run, the streams are flushed, then the process ends without the interpreter's
        teardown, where gloo's threads can abort it ("terminate called without an active exception")."""
        signal.signal(signal.SIGTERM, lambda *_: os._exit(code))
        if self.store is not None and together:
            try:
                self.exchange("leave", str(code), timeout_s=120.0)
                # rank 0 leaves last: outside torchrun its process hosts the store the others still read
                gone = f"{self.rounds}-gone"
                if self.is_main:
                    self._wait("gone", [f"{gone}/{r}" for r in range(1, self.world)], timeout_s=30.0)
                else:
                    self.store.set(f"{gone}/{self.rank}", "")
            except (RanksUnanswered, RuntimeError):
                pass  # a rank that died is torchrun's to report; this one leaves with its own code
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def child_env(port: int) -> dict[str, str]:
    """The re-execution's environment: this rank's own (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR), a fresh
    MASTER_PORT, and rank 0 hosting that rendezvous itself (torchrun's agent hosts the first run's)."""
    env = dict(os.environ)
    env["MASTER_PORT"] = str(port)
    env["TORCHELASTIC_USE_AGENT_STORE"] = "False"
    env.pop("TORCHELASTIC_ERROR_FILE", None)  # torchrun reads it for its workers' failures, not the children's
    return env


__all__ = ["Ranks", "RanksUnanswered", "child_env"]
