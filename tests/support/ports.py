"""The MASTER_PORT of a multi-process test job (2 gloo ranks started by hand, torchrun, Lightning's launcher) that no
job running at the same time can be given.

The old way, bind port 0, close, hand the number to the ranks, raced: seconds pass (the ranks import torch) before
rank 0's store binds it, and meanwhile any process may be handed the same number by its own bind to port 0: the
other pytest-xdist worker choosing the port of its own 2-rank job, or a gloo connection of a job already running
(gloo listens on a new port 0 per pair of ranks). Two jobs on one port mix their ranks: a rank trains with the other
job's rank, which runs another script with another bug (say the `lr` bug's: its updates explode and reach this
job's rank 0 through the gradient all-reduce, which then reports a `loss` finding, the kind of wrong finding seen
once in a full run under load), or a rank waits for a partner that never comes (a rank of Lightning's launcher,
whose port is chosen the same way, hung so for 600 s on this shared machine).

Here the port is taken below the kernel's ephemeral range (/proc/sys/net/ipv4/ip_local_port_range), where no bind
to port 0 ever lands, and held by a lock file for as long as the job runs, so that the suite's own concurrent jobs
skip it; a port some other program listens on is skipped too.
"""

import fcntl
import random
import socket
import tempfile
from contextlib import contextmanager
from pathlib import Path

LOCKS = Path(tempfile.gettempdir()) / "debug-nan-test-ports"


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


@contextmanager
def reserved_port():
    """A free TCP port below the ephemeral range, kept for this job until the block ends."""
    high = min(_ephemeral_low(), 65536)
    low = max(1024, high - 12000)
    LOCKS.mkdir(exist_ok=True)
    span = high - low
    start = random.randrange(span)
    for i in range(span):
        port = low + (start + i) % span
        lock = open(LOCKS / f"{port}.lock", "w")
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
        except OSError:  # another job of the suite holds it, or a program listens on it
            lock.close()
            continue
        try:
            yield port
        finally:
            lock.close()
        return
    raise RuntimeError(f"no free port in {low}..{high - 1}")
