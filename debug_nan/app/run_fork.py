"""A process forked from a watched one (os.fork, multiprocessing's "fork" start method): it inherits its parent's
watch, hooks and all, as a copy. `watching(watch)` registers, once per process, what the child does first:
  * the parent had not begun training (no optimizer yet: the script forks its workers first): the inherited watch
    is taken off, and the child's own first optimizer attaches a watch of its own (app/run_hook.py), whose result
    the child leaves in the run folder however it ends, os._exit included (a forked multiprocessing worker ends so);
  * the parent's watch had begun (an optimizer, a model watched): the inherited watch is taken off, and if the
    child trains (a backward, an optimizer step) it is refused there with one paragraph naming the fork, its result
    left for the one answer, exit 2. A child that never trains (a DataLoader worker) runs as without debug-nan.
"""

from __future__ import annotations

import os
import sys

import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from debug_nan.app import run_folder
from debug_nan.process import startup_hook

attached: list = []  # the watch the start-up hook attached in this process (app/run_hook.py's HookedWatch)
_current: list = []  # the watch installed in this process (the in-process Watch, or the hook's HookedWatch)
_registered: list[bool] = []


def watching(watch) -> None:
    """`watch` is installed in this process: a child forked from it starts as the module docstring says."""
    _current[:] = [watch]
    if not _registered:
        _registered.append(True)
        os.register_at_fork(after_in_child=_in_child)


def done(watch) -> None:
    """`watch` is taken off: a child forked now inherits nothing of it."""
    if _current and _current[0] is watch:
        _current.clear()


def _in_child() -> None:
    if not _current:
        return
    watch = _current.pop()
    hooks = watch.hooks
    began = hooks.state.root is not None or bool(hooks.state.other_optimizers) or watch.driver is not None
    hooks.uninstall()
    watch.ended = True  # (the parent's: its atexit, excepthook and results are not this process's)
    attached.clear()
    if began:
        _refuse_training(os.getppid())
    else:
        _arm()


def _arm() -> None:
    """A child forked before its parent trained: its own first optimizer attaches its watch, as the start-up hook
    arms a new process, and its os._exit (a forked multiprocessing worker's end: no atexit) leaves its result."""
    if "torch" in sys.modules:
        startup_hook.arm(sys.modules["torch"])
    else:
        sys.meta_path.insert(0, startup_hook.TorchImported())
    exit_now = os._exit

    def leave(code):
        for watch in attached:
            watch.exit_code = code
            watch.at_exit()
        exit_now(code)

    os._exit = leave


def _refuse_training(parent: int) -> None:
    """The child's first backward or optimizer step: refused (never the parent's watch state, copied mid-run)."""
    def refuse(*args, **kwargs):  # (as torch.autograd.backward and as an optimizer's step pre-hook)
        message = (f"process {os.getpid()} was forked (os.fork, or multiprocessing's \"fork\" "
                   f"start method) from process {parent} after that process had begun training under the watch, "
                   f"and it trains: a forked child inherits its parent's watch mid-run (its steps, its model's "
                   f"state), which cannot watch the child's own training. Start the worker with the \"spawn\" or "
                   f"\"forkserver\" start method (multiprocessing.get_context(\"spawn\"), "
                   f"torch.multiprocessing.spawn), or fork it before the parent creates its optimizer. debug-nan "
                   f"stopped this process (exit 2).")
        print(f"debug-nan: error: {message}", file=sys.stderr, flush=True)
        folder = run_folder.this_run()
        if folder is not None:
            folder.write_result({"rank": None, "world": 1, "pid": os.getpid(), "code": 2, "ending": run_folder.REFUSED,
                                 "held": "", "report": {"status": "error", "steps_run": 0, "first_nonfinite": None,
                                                        "findings": [], "error": message, "exit_code": 2}})
        sys.stdout.flush()
        os._exit(2)

    torch.autograd.backward = refuse  # (Tensor.backward calls it)
    register_optimizer_step_pre_hook(refuse)
