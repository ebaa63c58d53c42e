"""`python()`: the interpreter the tests start their Python processes with. A process of the suite spends about
4 of its 5 CPU-seconds importing torch and torch._dynamo; on the CI's 2 cores the suite starts about 230 of them
(torchrun's ranks included). So each pytest process keeps one warm interpreter (server.py) that imported them
once and forks a child per process (shim.py, an executable file in the session's temporary folder), which runs as
a fresh `python ARGS` would: its own argv, folder, environment, streams, signals and exit code, torch's and
numpy's seeds drawn anew. torchrun's ranks come from it too (PYTHON_EXEC, which torchrun reads).

It serves only the watched side: the plain run a test compares with (the reference: tests/support/run/
script_runs.py `alone`, side_by_side.py `plain`) always starts the real interpreter, so a comparison is never
imitation against imitation. What it cannot serve as a fresh interpreter would, it refuses and the real Python
runs: options other than -u, -B, -m and a script (`-c`, `-X`, `-W`...), an environment variable read at start
(OMP_NUM_THREADS, LANG, TORCH_LOGS, ...) that differs from this process's, a folder on sys.path that holds another
copy of a module already imported (a script's own `json.py`), descriptors passed on beyond 0-2. The tests of
processes themselves (signals, hang-ups, the startup without torch, setup.sh) start the real Python;
DEBUG_NAN_TEST_WARM=0 makes every process a real one. What still differs (none of it seen by a test here): the
modules torch imports are there before the script imports them (with the warning filters and atexit functions they
add), every child has this process's hash seed, its parent is the server, its stack is 5 frames deeper, and
resource limits, CPU affinity and niceness are the server's. Under a plain `pytest` (no OMP_NUM_THREADS, which
scripts/test.sh sets) torchrun's ranks (OMP_NUM_THREADS=1) run cold: slower, not different.
"""

from __future__ import annotations

import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
_started: dict[str, str] = {}


def python() -> str:
    """The executable for `[python(), ARGS]`: the warm interpreter's shim, or sys.executable when it is off."""
    if os.environ.get("DEBUG_NAN_TEST_WARM", "1") == "0":
        return sys.executable
    if "shim" not in _started:
        _start()
    return _started["shim"]


def refusals() -> list[str]:
    """What the warm interpreter refused so far (each line: `refused ARGV: why`), [] when it is off."""
    if "log" not in _started:
        return []
    return [line for line in Path(_started["log"]).read_text().splitlines() if line.startswith("refused ")]


def _start() -> None:
    folder = tempfile.mkdtemp(prefix="dn-warm-")
    socket_path = os.path.join(folder, "s")
    log = open(os.path.join(folder, "server.log"), "wb")
    server = subprocess.Popen([sys.executable, str(HERE / "server.py"), socket_path], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=log)
    if server.stdout.readline() != b"ready\n":
        raise RuntimeError(f"the warm interpreter did not start: {Path(log.name).read_text()[-2000:]}")
    shim = os.path.join(folder, "python")
    with open(shim, "w") as handle:
        handle.write(f"#!{sys.executable} -IS\n{(HERE / 'shim.py').read_text()}")
    os.chmod(shim, 0o755)
    atexit.register(_stop, server, folder)
    os.environ["DEBUG_NAN_WARM_SOCKET"] = socket_path
    os.environ["PYTHON_EXEC"] = shim  # torchrun starts its ranks with it
    _started["shim"], _started["log"] = shim, log.name


def _stop(server: subprocess.Popen, folder: str) -> None:
    server.stdin.close()  # (it kills what it still runs, then ends)
    try:
        server.wait(timeout=10)
    except subprocess.TimeoutExpired:
        server.kill()
    shutil.rmtree(folder, ignore_errors=True)
