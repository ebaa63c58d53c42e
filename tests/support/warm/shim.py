"""`python ARGS` through the warm interpreter (server.py), for the tests' processes and torchrun's workers
(PYTHON_EXEC): this process hands its argv, folder, environment and standard streams to the server, which forks
the process that runs them; it forwards the signals it gets to that process and ends as it ended (its exit code,
or killed by the same signal). When the server is not there or refuses, it becomes the real Python (exec).

Started as `PYTHON -IS shim.py` (from the executable file __init__.py writes): no site, nothing imported but the
standard library's few modules below, about 20 ms.
"""

import json
import os
import signal
import socket
import sys

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def real_python(argv: list[str], pending: list[int]) -> None:
    for number in FORWARDED:
        signal.signal(number, signal.SIG_IGN if number in IGNORED else signal.SIG_DFL)
    for number in pending:  # (what came before the process existed is this one's, as it would have been)
        os.kill(os.getpid(), number)
    os.execv(sys.executable, [sys.executable, *argv])


def inherited_descriptors() -> bool:
    """Descriptors beyond 0-2 the caller passed on (pass_fds, multiprocessing): only the real Python keeps them."""
    return any(int(fd) > 2 for fd in os.listdir("/proc/self/fd") if os.path.exists(f"/proc/self/fd/{fd}"))


def main() -> None:
    argv, pending, started = sys.argv[1:], [], []

    def forward(number, _):  # to the process and what it started (its own session), or held until it exists
        if not started:
            return pending.append(number)
        try:
            os.killpg(started[0], number)
        except OSError:
            os.kill(started[0], number)

    for number in FORWARDED:
        if number not in IGNORED:
            signal.signal(number, forward)
    path = os.environ.get("DEBUG_NAN_WARM_SOCKET")
    if not path or inherited_descriptors():
        real_python(argv, pending)
    umask = os.umask(0)
    os.umask(umask)
    body = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "ignored": sorted(IGNORED),
                       "umask": umask}).encode()
    try:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.connect(path)
        socket.send_fds(server, [f"{len(body)}\n".encode() + body], [0, 1, 2])
        answer = server.makefile("rb")
        word, _, value = answer.readline().decode().partition(" ")
    except OSError:
        real_python(argv, pending)
    if word != "P":
        real_python(argv, pending)
    started.append(int(value))
    for number in pending:
        forward(number, None)
    line = answer.readline().decode()
    if not line.startswith("X "):  # (the server went away: the process was killed with it)
        os._exit(1)
    code = int(line.split()[1])
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


IGNORED = {s for s in FORWARDED if signal.getsignal(s) == signal.SIG_IGN}
main()
