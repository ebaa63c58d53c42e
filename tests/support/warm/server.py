"""A warm interpreter for the tests' own Python processes: it imports torch (and torch._dynamo, which any
optimizer imports, and debug-nan) once, then forks one child per request, which runs `python [-u] [-B] -m MODULE
...` or `python [-u] [-B] SCRIPT.py ...` as a fresh interpreter would. A process of the suite spends about 4 of
its 5 CPU-seconds importing torch and torch._dynamo: the CI's 2 cores have about 230 such processes to start.

Run by tests/support/warm/__init__.py as `python server.py SOCKET`; requests come from shim.py. A request this
process cannot serve as a fresh interpreter would (another option, an environment variable read when torch or
Python starts, a PYTHONPATH that shadows a module already imported) is refused: the shim then runs the real Python.
Stdlib only until main() imports the warm modules; nothing here runs in a child but `serve_child`.
"""

import io
import json
import os
import selectors
import signal
import socket
import sys

# Variables the warm modules or Python read at start (refused when they differ) are all but these, which are read
# when used: the ranks' variables torchrun sets, the tests' and debug-nan's own, the paths.
MAY_DIFFER_PREFIXES = ("DEBUG_NAN_", "PYTEST_", "XDG_", "TORCHELASTIC_", "NCCL_", "TORCH_NCCL_", "HF_",
                       "TRANSFORMERS_", "WANDB_", "PL_", "LIGHTNING_", "ACCELERATE_", "SLURM_", "_TORCHINDUCTOR_")
MAY_DIFFER = {"PYTHONPATH", "PYTHONUNBUFFERED", "PYTHON_EXEC", "PWD", "OLDPWD", "HOME", "PATH", "RANK",
              "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
              "ROLE_NAME", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "CUDA_MODULE_LOADING",
              "TOKENIZERS_PARALLELISM", "CUBLAS_WORKSPACE_CONFIG", "COLUMNS", "LINES", "TERM", "NO_COLOR",
              "FORCE_COLOR", "CI", "LOGLEVEL"}
SET_BY_IMPORTS: dict[str, str] = {}  # (what importing the warm modules set in os.environ: its children keep it)
WARM_MODULES = ("torch", "torch._dynamo", "torch.distributed.run", "debug_nan.app.cli")


class Request:
    """One process to start: argv after the interpreter, cwd, environment, and how the shim's signals were set."""

    def __init__(self, data: dict):
        self.argv, self.cwd, self.env = data["argv"], data["cwd"], data["env"]
        self.ignored = set(data.get("ignored", ()))  # (signal numbers the shim inherited as ignored)
        self.umask = data.get("umask", 0o022)
        self.unbuffered, self.no_bytecode, self.module, self.script, self.args = False, False, None, None, []

    def parse(self) -> str | None:
        """-> why a fresh interpreter is needed, or None (then module or script, args and unbuffered are set)."""
        words = list(self.argv)
        while words and words[0] in ("-u", "-B"):
            option = words.pop(0)
            self.unbuffered |= option == "-u"
            self.no_bytecode |= option == "-B"
        if len(words) >= 2 and words[0] == "-m":
            self.module, self.args = words[1], ["-m", *words[2:]]
        elif words and not words[0].startswith("-") and words[0].endswith(".py"):
            self.script = os.path.join(self.cwd, words[0])  # (its __file__; sys.argv[0] is the word as given)
            self.args = words
            if not os.path.isfile(self.script):
                return f"no such script {words[0]}"
        else:
            return f"options {words[:2]}"
        self.unbuffered |= bool(self.env.get("PYTHONUNBUFFERED"))
        self.no_bytecode |= bool(self.env.get("PYTHONDONTWRITEBYTECODE"))
        return None

    @property
    def first_path(self) -> str:
        """sys.path[0]: the folder `python -m` starts in, or the script's own (its links resolved)."""
        return self.cwd if self.module else os.path.dirname(os.path.realpath(self.script))


def refusal(request: Request, start_env: dict, base_path: list[str]) -> str | None:
    """-> why `request` needs a fresh interpreter, or None. start_env: this process's environment before the warm
    modules were imported, and what they set (a request from a child of this server passes that on)."""
    why = request.parse()
    if why or not os.path.isdir(request.cwd):
        return why or "no such folder"
    for key in set(start_env) | set(request.env):
        if start_env.get(key) != request.env.get(key) and key not in MAY_DIFFER and key not in SET_BY_IMPORTS \
                and not key.startswith(MAY_DIFFER_PREFIXES):
            return f"environment variable {key}"
    for entry in [request.first_path, *python_path(request.env, request.cwd)]:
        if entry not in base_path and os.path.isdir(entry):
            try:
                names = {n.split(".")[0] for n in os.listdir(entry)} & set(sys.modules)
            except OSError as error:
                return f"sys.path entry {entry}: {error}"
            for name in sorted(names):
                if not same_module(entry, name):  # (a script's sibling tqdm.py is its tqdm, not site-packages')
                    return f"sys.path entry {entry} holds another {name}"
    return None


def same_module(entry: str, name: str) -> bool:
    """Is the module `name` that `entry` would give the one imported here?"""
    where = os.path.realpath(getattr(sys.modules[name], "__file__", None) or "")
    return os.path.dirname(where) in {os.path.realpath(entry), os.path.realpath(os.path.join(entry, name))}


def python_path(env: dict, cwd: str) -> list[str]:
    """PYTHONPATH's entries as Python puts them on sys.path (relative ones from the folder it starts in)."""
    return [os.path.normpath(os.path.join(cwd, p)) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]


def stdio(fd: int, write: bool, unbuffered: bool, like) -> io.TextIOWrapper:
    """What Python gives a fresh process as sys.stdin/stdout/stderr over `fd` (its encoding and errors: `like`'s,
    this process having started with the same locale variables)."""
    raw = io.FileIO(fd, "wb" if write else "rb", closefd=False)  # (Python's own are FileIO named as below)
    raw.name = {0: "<stdin>", 1: "<stdout>", 2: "<stderr>"}[fd]
    size = os.fstat(fd).st_blksize
    size = size if size > 1 else io.DEFAULT_BUFFER_SIZE  # (open()'s choice: the file's block size)
    if write and unbuffered:
        buffer = raw
    else:
        buffer = io.BufferedWriter(raw, size) if write else io.BufferedReader(raw, size)
    text = io.TextIOWrapper(buffer, encoding=like.encoding, errors=like.errors, newline="\n",
                            line_buffering=write and not unbuffered and (fd == 2 or raw.isatty()),
                            write_through=unbuffered)
    text.mode = "w" if write else "r"
    return text


def become(request: Request, base_path: list[str]) -> None:
    """In the forked child: this process's state made what a fresh `python ARGV` would start with (the variables
    the warm modules set when imported, such as torch's TORCHINDUCTOR_CACHE_DIR, kept where it sets none)."""
    os.setsid()
    os.umask(request.umask)
    os.chdir(request.cwd)
    os.environ.clear()
    os.environ.update({**SET_BY_IMPORTS, **request.env})
    for number in (signal.SIGTERM, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(number, signal.SIG_IGN if number in request.ignored else signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN if signal.SIGINT in request.ignored else signal.default_int_handler)
    old = {id(sys.__stdout__): "stdout", id(sys.__stderr__): "stderr"}
    sys.stdin = sys.__stdin__ = stdio(0, False, request.unbuffered, sys.__stdin__)
    sys.stdout = sys.__stdout__ = stdio(1, True, request.unbuffered, sys.__stdout__)
    sys.stderr = sys.__stderr__ = stdio(2, True, request.unbuffered, sys.__stderr__)
    streams_of_handlers(old)
    sys.dont_write_bytecode = request.no_bytecode
    sys.path[:] = [request.first_path, *python_path(request.env, request.cwd), *base_path]
    sys.path_importer_cache.clear()
    executable = sys.executable
    sys.argv = list(request.args)
    sys.orig_argv = [executable, *request.argv]
    import importlib
    import tempfile

    importlib.invalidate_caches()
    tempfile.tempdir = None
    reseed()


def streams_of_handlers(old: dict) -> None:
    """The logging handlers the warm modules made at import (torch's) write to this process's new streams, as
    they would have been made with them."""
    import logging

    loggers = [logging.getLogger(), *(v for v in logging.Logger.manager.loggerDict.values()
                                      if isinstance(v, logging.Logger))]
    for handler in {h for logger in loggers for h in logger.handlers if isinstance(h, logging.StreamHandler)}:
        if id(handler.stream) in old:
            handler.setStream(getattr(sys, old[id(handler.stream)]))


def reseed() -> None:
    """A fresh process draws torch's and numpy's default seeds from the OS (`random` reseeds itself at fork)."""
    import torch

    torch.seed()
    if "numpy.random" in sys.modules:
        sys.modules["numpy.random"].seed()


def run(request: Request, own_file: str = __file__) -> None:
    """The module or script as `__main__`; an uncaught exception printed as Python prints it (this file's frames
    left out), exit 1; SystemExit is left to the interpreter, which then ends as it always does."""
    import runpy

    try:
        if request.module:
            sys.modules.pop(request.module, None)  # (imported here, not in a fresh process: runpy would warn)
            runpy._run_module_as_main(request.module, alter_argv=True)
        else:
            run_script(request.script)
    except SystemExit:
        raise
    except BaseException as error:  # noqa: BLE001 - what the interpreter does with it
        tb = error.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename == own_file:
            tb = tb.tb_next
        sys.excepthook(type(error), error.with_traceback(tb), tb)
        if isinstance(error, KeyboardInterrupt):
            sys.stdout.flush()
            signal.signal(signal.SIGINT, signal.SIG_DFL)
            os.kill(os.getpid(), signal.SIGINT)
        raise SystemExit(1) from None


def run_script(path: str) -> None:
    import builtins
    import importlib.machinery

    with io.open_code(path) as handle:
        code = compile(handle.read(), path, "exec", dont_inherit=True)
    module = type(sys)("__main__")
    module.__dict__.update(__file__=path, __cached__=None, __package__=None, __spec__=None, __builtins__=builtins,
                           __annotations__={},
                           __loader__=importlib.machinery.SourceFileLoader("__main__", path))
    sys.modules["__main__"] = module
    exec(code, module.__dict__)


def serve(path: str, start_env: dict) -> tuple[Request, list[str]] | None:
    """Answer requests on the Unix socket `path` until stdin closes -> (the request, sys.path's base) in a child,
    None in this process when it is done. start_env: the environment before the warm modules were imported."""
    base_path = [p for p in sys.path[1:] if p not in python_path(start_env, os.getcwd())]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    wake_read, wake_write = socket.socketpair()
    wake_write.setblocking(False)
    signal.set_wakeup_fd(wake_write.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_read, selectors.EVENT_READ, "child")
    selector.register(sys.stdin, selectors.EVENT_READ, "stdin")
    children: dict[int, socket.socket] = {}  # (pid -> its shim's connection)
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.data == "stdin" and not sys.stdin.buffer.read1(1):
                for pid in children:
                    kill(pid)
                return None
            if key.data == "child":
                wake_read.recv(4096)
                reap(children, selector)
            elif key.data == "accept":
                connection, _ = listener.accept()
                started, request = start(connection, start_env, base_path)
                if started == 0:  # the child: every descriptor of this loop closed, it runs the request
                    for sock in (listener, wake_read, wake_write, connection, *children.values()):
                        sock.close()
                    signal.set_wakeup_fd(-1)
                    selector.close()
                    return request, base_path
                if started:
                    children[started] = connection
                    selector.register(connection, selectors.EVENT_READ, started)
            elif isinstance(key.data, int):  # the shim's end closed: it was killed, and so is its process
                if not receive_one(key.fileobj):
                    selector.unregister(key.fileobj)  # (reaped later: its status goes nowhere)
                    kill(key.data)


def start(connection: socket.socket, start_env: dict, base_path: list[str]) -> tuple[int | None, Request | None]:
    """Read a request; refuse it, or fork -> (0 in the child, the child's pid here, None when refused; it)."""
    message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)  # (the descriptors come with the first bytes)
    while b"\n" not in message and (more := connection.recv(1 << 20)):
        message += more
    size, _, body = message.partition(b"\n")
    while size.isdigit() and len(body) < int(size) and (more := connection.recv(1 << 20)):
        body += more
    try:
        request = Request(json.loads(body))
    except ValueError:  # (a shim killed before it sent all of it)
        connection.close()
        for fd in fds:
            os.close(fd)
        return None, None
    why = refusal(request, start_env, base_path)
    if why or len(fds) != 3:
        print(f"refused {request.argv[:3]}: {why}", file=sys.stderr, flush=True)  # (server.log: what ran cold)
        try:
            connection.sendall(f"R {why}\n".encode())
        except OSError:
            pass
        connection.close()
        for fd in fds:
            os.close(fd)
        return None, request
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        return 0, request
    for fd in fds:
        os.close(fd)
    try:
        connection.sendall(f"P {pid}\n".encode())
    except OSError:  # (the shim was killed while it waited: so is its process, reaped with the others)
        kill(pid)
    return pid, request


def receive_one(connection: socket.socket) -> bytes:
    try:
        return connection.recv(1)
    except OSError:
        return b""


def kill(pid: int) -> None:
    """The child and what it started (its own session), or the child alone before it made that session."""
    for end in (os.killpg, os.kill):
        try:
            return end(pid, signal.SIGKILL)
        except OSError:
            continue


def reap(children: dict, selector) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = children.pop(pid, None)
        if connection is not None:
            if connection in selector.get_map():  # (not when its shim was gone first)
                selector.unregister(connection)
            try:
                connection.sendall(f"X {os.waitstatus_to_exitcode(status)}\n".encode())
            except OSError:
                pass
            connection.close()


def main() -> None:
    import importlib

    start_env = dict(os.environ)
    for name in WARM_MODULES:
        importlib.import_module(name)
    SET_BY_IMPORTS.update({k: v for k, v in os.environ.items() if k not in start_env})
    served = serve(sys.argv[1], start_env)
    if served is None:
        return
    request, base_path = served
    become(request, base_path)
    del served
    run(request)


if __name__ == "__main__":
    main()
