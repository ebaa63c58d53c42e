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


def real_python(argv: list[str]) -> None:
    os.execv(sys.executable, [sys.executable, *argv])


def main() -> None:
    argv = sys.argv[1:]
    path = os.environ.get("DEBUG_NAN_WARM_SOCKET")
    if not path:
        real_python(argv)
    ignored = [int(s) for s in FORWARDED if signal.getsignal(s) == signal.SIG_IGN]
    body = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ), "ignored": ignored}).encode()
    try:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.connect(path)
        socket.send_fds(server, [f"{len(body)}\n".encode() + body], [0, 1, 2])
        answer = server.makefile("rb")
        word, _, value = answer.readline().decode().partition(" ")
    except OSError:
        real_python(argv)
    if word != "P":
        real_python(argv)
    pid = int(value)
    for number in FORWARDED:
        if number not in ignored:
            signal.signal(number, lambda received, _: os.kill(pid, received))
    line = answer.readline().decode()
    if not line.startswith("X "):  # (the server went away: the process was killed with it)
        os._exit(1)
    code = int(line.split()[1])
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


main()
