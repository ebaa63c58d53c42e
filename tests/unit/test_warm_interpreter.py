"""tests/support/warm: a process the tests start through the warm interpreter sees what a fresh `python ARGS`
would show it (argv, sys.path[0], __file__, its streams, folder, environment, exit code, traceback, signals), each
with seeds of its own; what it cannot serve that way runs the real Python."""

import os
import signal
import subprocess
import sys
import time

import pytest

from tests.support import warm

VIEW = """\
import sys
print("served" if "torch._dynamo" in sys.modules else "fresh", file=sys.stderr)
import os, torch
print(sys.argv, sys.path[0], __file__, __name__, os.getcwd(), os.environ.get("DEBUG_NAN_SEEN"))
for stream in (sys.stdin, sys.stdout, sys.stderr):
    print(stream.name, stream.encoding, stream.errors, stream.line_buffering, stream.write_through)
print("stdin:", repr(sys.stdin.read()), sys.dont_write_bytecode, oct(os.umask(0)))
print("to stderr", file=sys.stderr)
if sys.argv[1:] == ["raise"]:
    raise ValueError("the script's own error")
if sys.argv[1:] == ["wait"]:
    print("waiting", flush=True)
    import time
    time.sleep(60)
print(torch.initial_seed() % 1000 if sys.argv[1:] == ["seed"] else "", end="")
sys.exit(7 if sys.argv[1:] == ["exit"] else None)
"""


@pytest.fixture
def script(tmp_path):
    (tmp_path / "view.py").write_text(VIEW)
    return tmp_path


def both(folder, *args, **kwargs):
    """The same command run by the real Python and through the warm interpreter -> (real, warm)."""
    shim = warm.python()  # (first: it puts the server's address in os.environ)
    env = dict(os.environ, DEBUG_NAN_SEEN="yes")
    return [subprocess.run([exe, *args], cwd=folder, env=env, capture_output=True, input=b"in\r\nput\n",
                           timeout=120, **kwargs) for exe in (sys.executable, shim)]


def served(real, warm_one) -> bool:
    """Both ended alike, printed the same, and the second was forked from the warm interpreter."""
    assert real.stderr.startswith(b"fresh\n")
    assert (warm_one.returncode, warm_one.stdout, warm_one.stderr.split(b"\n", 1)[1]) == (
        real.returncode, real.stdout, real.stderr.split(b"\n", 1)[1])
    return warm_one.stderr.startswith(b"served\n")


@pytest.mark.parametrize("args", [["view.py"], ["-u", "view.py"], ["-B", "view.py"], ["view.py", "exit"],
                                  ["view.py", "raise"], ["-m", "view"]])
def test_a_served_process_sees_what_a_fresh_one_sees(script, args):
    real, warm_one = both(script, *args)
    assert served(real, warm_one)
    assert real.returncode == {"exit": 7, "raise": 1}.get(args[-1], 0)
    assert b"stdin: 'in\\r\\nput\\n' " + (b"True" if "-B" in args else b"") in real.stdout


def test_a_module_the_warm_interpreter_imported_runs_as_main_without_a_warning(tmp_path):
    real, warm_one = both(tmp_path, "-m", "torch.distributed.run", "--help")
    assert (warm_one.returncode, warm_one.stdout, warm_one.stderr) == (0, real.stdout, real.stderr == b"" and b"")


def test_a_script_whose_sibling_shadows_an_imported_module_runs_fresh(script):
    (script / "json.py").write_text("MINE = True\n")
    (script / "uses.py").write_text("import json\nprint(json.MINE)\n")
    real, warm_one = both(script, "uses.py")
    assert real.stdout == warm_one.stdout == b"True\n" and any("holds another json" in r for r in warm.refusals())


def test_shims_killed_as_they_start_leave_the_server_serving(script):
    for _ in range(4):
        shim = subprocess.Popen([warm.python(), "view.py", "wait"], cwd=script, stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shim.kill()
        shim.wait()
    assert served(*both(script, "view.py"))


def test_each_served_process_draws_its_own_seed(script):
    seeds = {subprocess.run([warm.python(), "view.py", "seed"], cwd=script, capture_output=True, text=True,
                            timeout=120).stdout.splitlines()[-1] for _ in range(3)}
    assert len(seeds) == 3


def test_a_signal_to_the_shim_reaches_the_process_and_its_exit_mirrors_it(script):
    shim = subprocess.Popen([warm.python(), "view.py", "wait"], cwd=script, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert shim.stdout.readline().startswith("['view.py', 'wait']")  # (served: see the next test)
    deadline = time.monotonic() + 60
    while "waiting" not in shim.stdout.readline() and time.monotonic() < deadline:
        pass
    shim.send_signal(signal.SIGTERM)
    assert shim.wait(timeout=60) == -signal.SIGTERM


def test_what_it_cannot_serve_runs_the_real_python(script):
    done = subprocess.run([warm.python(), "-c", "import sys; print(sys.argv)"], cwd=script, capture_output=True,
                          text=True, timeout=120)
    assert done.stdout == "['-c']\n" and any("['-c'" in r for r in warm.refusals())
    other_threads = dict(os.environ, OMP_NUM_THREADS="3")
    done = subprocess.run([warm.python(), "view.py"], cwd=script, env=other_threads, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0 and any("OMP_NUM_THREADS" in r for r in warm.refusals())
