"""How much memory this machine can still give (bytes), for the checks that fail with a message before a run or a
computation would be killed by the kernel: the smaller of the system's MemAvailable and the cgroup's (container's)
limit minus its usage. None when neither can be read (then nothing is refused)."""

from __future__ import annotations

from pathlib import Path


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
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


def size_text(n: float) -> str:
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"
