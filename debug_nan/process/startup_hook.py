"""The start-up hook of `debug-nan run -- PROGRAM`: this file is copied as `sitecustomize.py` into the run's private
folder, which debug-nan puts first on the PYTHONPATH of the command it starts, so every Python process beneath it
(torchrun's workers, a shell script's python, `torch.multiprocessing.spawn`'s and Lightning's ranks) runs it at
interpreter start-up, as coverage.py and opentelemetry-instrument reach every process of a command.

Standard library only, and inert until the process trains: it runs the user's own sitecustomize (the next one on
sys.path), takes its folder off sys.path again, and waits for `torch` to be imported (one name check per import);
then it wraps `torch.optim.Optimizer.__init__` and nothing else (besides sys.excepthook, which leaves a launcher's
ChildFailedError, the exit code of a worker killed before it could say so, for the answer: `_launcher_failures`).
The first optimizer the process creates imports debug-nan and attaches its watch there (`ATTACH`,
debug_nan/app/run_hook.py), before that optimizer exists; a process that never creates one (the launcher's agent,
a DataLoader worker, the shell's helpers) runs as without debug-nan. Switched on by DEBUG_NAN_RUN_DIR (the private
run folder); a process where debug-nan cannot be imported (another interpreter) is left alone.
"""

import os
import sys

RUN_DIR = "DEBUG_NAN_RUN_DIR"  # the run's private folder (this file's, and the ranks' results)
ATTACH = "debug_nan.app.run_hook"  # its attach(): the watch, in the process that creates an optimizer


def _chain(here: str) -> None:
    """The user's own sitecustomize (the next on sys.path after this folder), run as Python would have run it."""
    from importlib._bootstrap import module_from_spec  # (both frozen and loaded at start: importlib.util is not)
    from importlib._bootstrap_external import PathFinder

    ours = sys.modules.pop("sitecustomize", None)
    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        if ours is not None:
            sys.modules["sitecustomize"] = ours
        return
    module = module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception:  # noqa: BLE001 - as site.py does with a failing sitecustomize: say so, go on
        import traceback

        print("Error in sitecustomize; set PYTHONVERBOSE for traceback:", file=sys.stderr)
        traceback.print_exc()


class TorchImported:
    """A meta path finder that sees `import torch` go by and, once torch has run, arms the first optimizer."""

    def find_spec(self, name, path=None, target=None):
        if name != "torch":
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(name, path, target) if find is not None else None
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                spec.loader = _ArmAfter(spec.loader)
                return spec
        return None


class _ArmAfter:
    """torch's own loader, which arms the first optimizer once torch's module has run."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        module.__loader__ = module.__spec__.loader = self.loader  # (torch's own, for whoever reads it later)
        arm(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)


def arm(torch) -> None:
    """torch is imported: its first Optimizer.__init__ attaches the watch (once), then creates the optimizer."""
    optimizer = torch.optim.Optimizer
    original = optimizer.__init__

    def first_optimizer(self, *args, **kwargs):
        optimizer.__init__ = original
        try:
            __import__(ATTACH, fromlist=["attach"]).attach()
        except Exception as exc:  # noqa: BLE001 - (debug-nan's own failure: the run goes on unwatched, and says so)
            print(f"debug-nan: error: the watch could not attach in process {os.getpid()}: "
                  f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return optimizer.__init__(self, *args, **kwargs)

    first_optimizer.__wrapped__ = original
    optimizer.__init__ = first_optimizer


def _launcher_failures(original):
    """sys.excepthook of a process of the run: a launcher's ChildFailedError (torchrun's, naming each failed
    worker's global rank, pid and exit code: -9 for SIGKILL) is left in the run folder (`launcher/<pid>.json`) for
    the one answer, since a killed rank cannot say how it ended; then Python's own traceback, as without debug-nan."""

    def excepthook(kind, value, traceback):
        failures = getattr(value, "failures", None) if kind.__name__ == "ChildFailedError" else None
        folder = os.environ.get(RUN_DIR)
        if isinstance(failures, dict) and folder:
            try:
                import json

                said = {str(rank): {"exitcode": getattr(f, "exitcode", None), "pid": getattr(f, "pid", None)}
                        for rank, f in failures.items()}
                os.makedirs(os.path.join(folder, "launcher"), exist_ok=True)
                with open(os.path.join(folder, "launcher", f"{os.getpid()}.json"), "w") as out:
                    json.dump(said, out)
            except Exception:  # noqa: BLE001 - (what the launcher said is a detail of the answer: its traceback shows)
                pass
        original(kind, value, traceback)

    return excepthook


def start(path: str) -> None:
    """At interpreter start-up, from the run folder's sitecustomize.py (`path`)."""
    here = os.path.dirname(os.path.abspath(path))
    _chain(here)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]  # the script's sys.path as usual
    if not os.environ.get(RUN_DIR):
        return
    sys.excepthook = _launcher_failures(sys.excepthook)
    if "torch" in sys.modules:  # (the user's sitecustomize imported it)
        arm(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, TorchImported())


if __name__ == "sitecustomize":
    start(__file__)
