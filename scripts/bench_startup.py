"""What `debug-nan run -- PROGRAM`'s start-up hook costs a Python process that never trains (a launcher's agent, a
DataLoader worker, a shell's python): the wall time of fresh interpreters with and without the run folder first on
PYTHONPATH (app/run_folder.py), paired and alternated, the median of each.

    python scripts/bench_startup.py [--runs 20]

Two programs: `python -c pass` (the hook chains the user's sitecustomize and waits for torch: one name check per
import) and `python -c "import torch"` (torch imported: its Optimizer.__init__ armed, nothing of debug-nan
imported). Prints one line per program: plain ms, hooked ms, the difference (on a busy machine the difference of
two wall times is noisy), and the hook's own import time as `python -X importtime` reports it (its sitecustomize
line), which does not depend on what else the machine runs as much.
"""

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from debug_nan.app.run_folder import RunFolder
from debug_nan.app.run_options import RunOptions

PROGRAMS = {"python -c pass": "pass", 'python -c "import torch"': "import torch"}


def once(code: str, env: dict) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    return time.perf_counter() - started


def hook_import_ms(env: dict) -> float:
    """The sitecustomize line of `python -X importtime -c pass`: the hook's own import, cumulative (ms)."""
    err = subprocess.run([sys.executable, "-X", "importtime", "-c", "pass"], env=env, capture_output=True,
                         text=True, check=True).stderr
    line = next(row for row in err.splitlines() if row.split("|")[-1].strip() == "sitecustomize")
    return int(line.split("|")[1]) / 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=20)
    runs = parser.parse_args().runs
    plain_env = dict(os.environ)
    with tempfile.TemporaryDirectory() as tmp:
        hooked_env = RunFolder(os.path.join(tmp, "run")).make().environment(RunOptions())
        for name, code in PROGRAMS.items():
            once(code, plain_env)  # (the file cache warm for both)
            plain, hooked = [], []
            for _ in range(runs):
                plain.append(once(code, plain_env))
                hooked.append(once(code, hooked_env))
            p, h = statistics.median(plain) * 1e3, statistics.median(hooked) * 1e3
            print(f"{name:<28} plain {p:7.1f} ms   hooked {h:7.1f} ms   hook {h - p:+6.1f} ms  (median of {runs})")
            if code == "pass":
                own = [hook_import_ms(hooked_env) for _ in range(runs)]
                print(f"the hook's own import (python -X importtime, its sitecustomize line): median "
                      f"{statistics.median(own):.1f} ms, least {min(own):.1f} ms (of {runs})")


if __name__ == "__main__":
    main()
