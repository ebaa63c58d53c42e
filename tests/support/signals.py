"""Signals sent to a real process at a point it has reached, never after a guessed delay."""


def handles(pid: int, signum: int) -> bool:
    """Has the process installed its handler for `signum` (SigCgt in /proc)?"""
    with open(f"/proc/{pid}/status") as status:
        caught = next(int(line.split()[1], 16) for line in status if line.startswith("SigCgt:"))
    return bool(caught & (1 << (signum - 1)))


def loaded(pid: int, library: str) -> bool:
    """Has the process mapped a shared library whose file name holds `library` (/proc/PID/maps)? E.g.
    "libtorch_cpu": it is inside `import torch`, whose Python modules take seconds more to load."""
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return any(library in line for line in maps)
    except OSError:  # (the process has ended)
        return False
