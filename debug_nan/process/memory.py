"""How much memory this machine can still give (bytes), for the checks that fail with a message before a run or a
computation would be killed by the kernel: the smaller of the system's MemAvailable and the cgroup's (container's)
limit minus its usage. None when neither can be read (then nothing is refused)."""

from __future__ import annotations

import os
from pathlib import Path


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:  # not Linux: the free pages
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_available() -> int | None:
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit == "max":
            return None
        used = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
        return max(int(limit) - used, 0)
    except (OSError, ValueError):
        return None


def available_bytes() -> int | None:
    known = [n for n in (_meminfo_available(), _cgroup_available()) if n is not None]
    return min(known) if known else None


def size_text(n: float, digits: int = 1) -> str:
    """2.5 * 2**30 -> '2.5 GiB' (the units of CUDA's and the kernel's out-of-memory messages)."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.{digits}f} {unit}"
    return f"{n:.0f} B"
