"""The start-up hook of `debug-nan run -- PROGRAM` (process/startup_hook.py, copied as sitecustomize.py into the
run's folder, app/run_folder.py), in this process: inert without the run folder, the user's own sitecustomize
chained, the folder off sys.path, and the watch attached at the first optimizer only (a stand-in torch: the real
one is the e2e tests' and scripts/bench_startup.py's)."""

import os
import sys
import threading
import types

import pytest

from debug_nan.app.run_folder import RunFolder
from debug_nan.app.run_hook import HookedWatch, _node_ranks
from debug_nan.app.run_options import RunOptions
from debug_nan.process import startup_hook


@pytest.fixture
def hook_dir(tmp_path, monkeypatch):
    folder = RunFolder(str(tmp_path / "run")).make()
    monkeypatch.setattr(sys, "path", [str(folder.hook), *sys.path])
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    monkeypatch.setitem(sys.modules, "sitecustomize", types.ModuleType("sitecustomize"))
    monkeypatch.delitem(sys.modules, "torch")  # (as at start-up: torch not imported yet, so nothing is armed here)
    return folder


def test_the_folder_holds_the_hook_and_the_environment_names_it(tmp_path):
    folder = RunFolder(str(tmp_path / "run")).make()
    env = folder.environment(RunOptions(max_steps=3), base={"PYTHONPATH": "/theirs"})
    assert (folder.hook / "sitecustomize.py").read_text() == open(startup_hook.__file__).read()
    assert env["PYTHONPATH"].split(os.pathsep) == [str(folder.hook), "/theirs"]
    assert env[startup_hook.RUN_DIR] == str(folder.path) and '"max_steps": 3' in env["DEBUG_NAN_RUN_OPTIONS"]


def test_without_the_run_folder_it_only_chains_and_leaves_sys_path(hook_dir, monkeypatch):
    monkeypatch.delenv(startup_hook.RUN_DIR, raising=False)
    finders = list(sys.meta_path)
    startup_hook.start(str(hook_dir.hook / "sitecustomize.py"))
    assert sys.meta_path == finders and str(hook_dir.hook) not in sys.path


def test_the_users_own_sitecustomize_runs(hook_dir, tmp_path, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "sitecustomize.py").write_text("USER = 'theirs'\n")
    monkeypatch.setattr(sys, "path", [*sys.path, str(mine)])
    monkeypatch.setenv(startup_hook.RUN_DIR, str(hook_dir.path))
    startup_hook.start(str(hook_dir.hook / "sitecustomize.py"))
    assert sys.modules["sitecustomize"].USER == "theirs"
    waiting = [f for f in sys.meta_path if isinstance(f, startup_hook.TorchImported)]
    assert len(waiting) == 1 and waiting[0].find_spec("numpy") is None  # one name check per import, nothing else


def test_the_first_optimizer_attaches_the_watch_once(monkeypatch):
    attached = []
    monkeypatch.setitem(sys.modules, "fake_attach", types.SimpleNamespace(attach=lambda: attached.append(1)))
    monkeypatch.setattr(startup_hook, "ATTACH", "fake_attach")

    class Optimizer:
        def __init__(self, params):
            self.params = params

    fake = types.SimpleNamespace(optim=types.SimpleNamespace(Optimizer=Optimizer))
    startup_hook.arm(fake)
    assert Optimizer.__init__.__name__ == "first_optimizer" and not attached  # armed, nothing imported yet
    assert Optimizer([1]).params == [1] and Optimizer([2]).params == [2]
    assert attached == [1] and Optimizer.__init__.__name__ == "__init__"


def test_sys_exit_gives_the_process_code_from_the_main_thread_only(tmp_path):
    """The watch reads the code the process exits with from sys.exit (an atexit function cannot read it); a
    thread's sys.exit ends that thread, not the process; a script that never calls it leaves the code unseen."""
    watch = HookedWatch(RunOptions(), RunFolder(str(tmp_path / "run")).make())
    assert watch.exit_code is None
    ended = []

    def in_a_thread():
        try:
            watch.exit(4)
        except SystemExit as exc:
            ended.append(exc.code)

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join()
    assert ended == [4] and watch.exit_code is None
    with pytest.raises(SystemExit) as raised:
        watch.exit(3)
    assert raised.value.code == 3 and watch.exit_code == 3
    with pytest.raises(SystemExit):
        watch.exit("bad config")  # (Python prints it and exits 1)
    assert watch.exit_code == 1


def test_the_nodes_ranks_are_torchruns_span(monkeypatch):
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "4")
    assert _node_ranks() == [4, 5, 6, 7]
    monkeypatch.delenv("LOCAL_WORLD_SIZE")
    assert _node_ranks() is None  # (not torchrun: every rank of the world is this command's)
