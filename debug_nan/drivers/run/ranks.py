"""`torchrun ... -m debug_nan run -- train.py`: this process's place among the ranks of the user's DDP job.

Every rank runs the script in-process as without torchrun. While it trains, the ranks agree on every
micro-batch's trip decision through the script's own process group (engine/session/agreement.py RankAgreement, built
here from the group the script initialised), and each that saw the harm first replays its own micro-batch in place.
To leave together they talk through the process group's key-value store instead of collectives: the
script may have destroyed its group while it was stopped (a `finally: dist.destroy_process_group()`), and a store
key cannot leave a rank waiting inside a collective. Every wait has a deadline and names the missing rank.
"""

from __future__ import annotations

import atexit
import faulthandler
import os
import signal
import sys
import time

import torch.distributed as dist

from debug_nan.drivers import ddp
from debug_nan.engine.session.distributed import DistContext, detect
from debug_nan.errors import InputError

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

    @classmethod
    def of_group(cls) -> Ranks | None:
        """A process with no RANK in its environment (torch.multiprocessing.spawn's workers, Lightning's ranks): its
        place as the script's initialised process group says it, or None (no group, or a group of one)."""
        ctx = ddp.context()
        return cls(ctx) if ctx is not None else None

    @staticmethod
    def report_fatal_signals() -> None:
        """A rank killed by a fatal signal (SIGABRT from a native thread, SIGSEGV) prints every thread's Python
        stack on its stderr before it dies (Python's faulthandler), unless the script set its own: torchrun says
        only "exitcode: -6", and such an end was seen once, rarely, after a healthy FSDP2 run (docs/torchrun.md)."""
        if not faulthandler.is_enabled():
            faulthandler.enable(all_threads=True)

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

    # -- leaving ---------------------------------------------------------------------------------------------
    def leave(self, code: int, together: bool = True) -> None:
        """End this rank with `code`: once every rank is done when they all end at the same point (`together`:
        torchrun stops the others as soon as one exits non-zero, which could cut rank 0's report short), at once
        when this rank failed alone (the others may be waiting inside a collective: torchrun stops them). The
        script's atexit functions run, the streams are flushed, then the process ends without the interpreter's
        teardown, where gloo's threads can abort it ("terminate called without an active exception")."""
        signal.signal(signal.SIGTERM, lambda *_: os._exit(code))
        if together:
            self.meet(code)
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


    def meet(self, code: int, timeout_s: float = 120.0) -> None:
        """Every rank at its end: wait until all are there, rank 0 last (outside torchrun its process hosts the
        store the others still read). A rank that died is the launcher's to report: this one goes on."""
        if self.store is None:
            return
        try:
            self.exchange("leave", str(code), timeout_s=timeout_s)
            gone = f"{self.rounds}-gone"
            if self.is_main:
                self._wait("gone", [f"{gone}/{r}" for r in range(1, self.world)], timeout_s=30.0)
            else:
                self.store.set(f"{gone}/{self.rank}", "")
        except (RanksUnanswered, RuntimeError):
            pass


__all__ = ["Ranks", "RanksUnanswered"]
