"""The supported range (debug_nan/torch_support.py): a Python or torch below it gets one line at start (the CLI
exits 2, the Monitor and the callbacks raise), a newer one than tested one note; and each place where torch's
behaviour differs between the supported versions is tested on both sides (the side this torch is on for real, the
other through a stand-in of torch's API)."""

import os
import subprocess
import sys
from importlib import metadata

import pytest
import torch
from click.testing import CliRunner

from debug_nan import torch_support
from debug_nan.app.cli import main
from tests.conftest import REPO


def test_versions_are_read_without_local_or_prerelease_parts():
    assert torch_support.parse("2.4.1+cu121") == (2, 4, 1)
    assert torch_support.parse("2.6.0a0+git1234") == (2, 6, 0)
    assert torch_support.parse("2.13") == (2, 13, 0)


@pytest.mark.parametrize("python, torch_version, refused", [
    ((3, 9, 18), None, True),
    ((3, 10, 13), "2.4.0", False),
    ((3, 10, 13), "2.3.1", True),
    ((3, 12, 1), "2.4.1+cu121", False),
    ((3, 13, 0), "2.4.1", True),  # torch 2.4 has no build for Python 3.13
    ((3, 13, 0), "2.5.1+cu124", False),
    ((3, 14, 0), "2.9.0", False),  # newer than tested: a note, not a refusal
])
def test_the_range(python, torch_version, refused):
    problem = (torch_support.python_problem(python) if torch_version is None
               else torch_support.torch_problem(torch_version, python))
    assert (problem is not None) == refused
    if refused:
        found = f"torch {torch_version}" if torch_version else "Python 3.9.18"
        assert torch_support.RANGE in problem and found in problem and "\n" not in problem


def test_newer_than_tested_is_a_note():
    assert torch_support.untested("2.13.0", (3, 13, 0)) is None
    note = torch_support.untested("2.14.0", (3, 14, 1))
    assert "Python 3.14.1 and torch 2.14.0 is newer than the newest tested" in note and "\n" not in note


@pytest.mark.parametrize("words", [["--max-steps", "1"], ["run", "--", "python", "train.py"],
                                   ["replay", "bundle.pt"]])
def test_an_old_torch_is_one_line_and_exit_2_at_the_cli(words, monkeypatch, tmp_path):
    monkeypatch.setattr(torch, "__version__", "2.3.1")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")  # (`run` resolves its command first: a program imports no torch)
    result = CliRunner().invoke(main, words)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert lines == [f"debug-nan: error: debug-nan supports {torch_support.RANGE}; found torch 2.3.1 on Python "
                     f"{'.'.join(map(str, sys.version_info[:3]))}: install torch >= "
                     f"2.{torch_support.oldest_torch()[1]} "
                     f"(the range is in docs/support.md)."]


def test_a_programs_top_process_checks_the_installed_torch_without_importing_it(monkeypatch, tmp_path):
    """`debug-nan run -- PROGRAM` only starts the program: torch's version is read from its package metadata (the
    imported torch's, a newer one here, is not what it checks), and an old one stops it before the program starts."""
    monkeypatch.setattr(torch, "__version__", "2.99.0")
    real = metadata.version
    monkeypatch.setattr(metadata, "version", lambda name: "2.3.1" if name == "torch" else real(name))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["run", "--", "sh", "-c", "touch started"])
    assert result.exit_code == 2 and "found torch 2.3.1 on Python" in result.output, result.output
    assert not (tmp_path / "started").exists()


def _python(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_an_old_torch_stops_the_monitor_and_the_callbacks_at_import():
    """debug_nan.drivers.monitor is what the Monitor and both callbacks import first: its import raises, with the
    line."""
    done = _python("import torch; torch.__version__ = '2.3.1'\n"
                   "try:\n    from debug_nan import Monitor\n"
                   "except Exception as exc:\n    print(type(exc).__name__, exc)")
    assert done.stdout.startswith("UnsupportedVersion debug-nan supports") and "found torch 2.3.1" in done.stdout


def test_an_old_python_is_one_line_before_anything_else():
    """Python 3.9 (stood in for: sys.version_info replaced before the import): the CLI prints the line and exits 2,
    a library import raises ImportError with it."""
    old = "import sys; sys.version_info = (3, 9, 18, 'final', 0)\n"
    cli = _python(old + "sys.argv = ['debug-nan', '--help']\nimport debug_nan")
    assert cli.returncode == 2 and cli.stderr.strip() == (
        f"debug-nan: error: debug-nan supports {torch_support.RANGE}; found Python 3.9.18.")
    library = _python(old + "try:\n    import debug_nan\nexcept ImportError as exc:\n    print(exc)")
    assert library.stdout.strip() == f"debug-nan supports {torch_support.RANGE}; found Python 3.9.18."


# -- each behavioural difference, on both sides ------------------------------------------------------------------

def _fake_ddp_init(with_forward_sync: bool):
    if with_forward_sync:
        def init(self, module, device_ids=None, broadcast_buffers=None, forward_sync_buffers=True):
            pass
    else:
        def init(self, module, device_ids=None, broadcast_buffers=True):
            pass
    return init


@pytest.mark.parametrize("newer", [True, False])
def test_ddp_buffer_broadcast_is_turned_off_in_the_spelling_of_this_torch(newer, monkeypatch):
    from torch.nn.parallel import DistributedDataParallel

    monkeypatch.setattr(DistributedDataParallel, "__init__", _fake_ddp_init(newer))
    assert torch_support.ddp_without_buffer_broadcast() == (
        {"forward_sync_buffers": False} if newer else {"broadcast_buffers": False})


def test_ddp_buffer_broadcast_keyword_is_the_real_one_here():
    import inspect

    from torch.nn.parallel import DistributedDataParallel

    (key,) = torch_support.ddp_without_buffer_broadcast()
    assert key in inspect.signature(DistributedDataParallel.__init__).parameters


@pytest.mark.parametrize("newer", [True, False])
def test_torchrun_records_terminated_workers_is_read_from_torchs_agent(newer, monkeypatch):
    from torch.distributed.elastic.multiprocessing import api

    if newer:
        monkeypatch.setattr(api.SubprocessContext, "_capture_process_failures", lambda self, done: None,
                            raising=False)
    else:
        monkeypatch.delattr(api.SubprocessContext, "_capture_process_failures", raising=False)
    assert torch_support.torchrun_records_terminated_workers() == newer


def _old_python() -> str | None:
    import glob

    found = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9.*/bin/python")))
    return found[-1] if found else None


@pytest.mark.skipif(_old_python() is None, reason="no Python 3.9 here (pyenv's)")
def test_a_real_python_3_9_gets_the_line_and_exit_2():
    done = subprocess.run([_old_python(), "-m", "debug_nan", "--version"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("debug-nan: error: debug-nan supports Python 3.10-3.13")
    assert done.stderr.count("\n") == 1 and "found Python 3.9." in done.stderr


def test_the_torch_of_this_suite_is_inside_the_tested_range():
    """A newer torch in a leg (or the main leg's pin moved) is a reminder to move TORCH_NEWEST_TESTED with it."""
    assert torch_support.torch_problem(torch.__version__) is None and torch_support.untested(torch.__version__) is None


@pytest.mark.parametrize("python, torch_version, pure", [((3, 13, 0), "2.5.1", True), ((3, 13, 0), "2.6.0", False),
                                                         ((3, 12, 1), "2.5.1", False)])
def test_the_bundle_is_saved_through_a_pickler_that_python_3_13_lets_torch_2_5_use(python, torch_version, pure):
    import io

    options = torch_support.save_options(python, torch_version)
    assert options == {} if not pure else set(options) == {"pickle_module"}
    if pure:  # the pure-Python pickler works with every torch: a file any torch.load reads
        buffer = io.BytesIO()
        torch.save({"x": torch.arange(3.0), "note": "bundle"}, buffer, **options)
        buffer.seek(0)
        assert torch.load(buffer, weights_only=False)["x"].tolist() == [0.0, 1.0, 2.0]


def test_torch_save_needs_the_pure_pickler_exactly_where_torch_support_says():
    import io

    try:
        torch.save({"x": torch.ones(1)}, io.BytesIO())
        plain_works = True
    except AttributeError as exc:
        assert "persistent_id" in str(exc)
        plain_works = False
    assert plain_works == (torch_support.save_options() == {})


def test_torch_compile_works_exactly_where_torch_support_says():
    assert torch_support.compile_supported((3, 13, 0), "2.5.1") is False
    assert torch_support.compile_supported((3, 13, 0), "2.6.0") and torch_support.compile_supported((3, 12, 1), "2.4.1")
    try:
        torch.compile(torch.nn.Linear(2, 1), backend="eager")(torch.ones(1, 2))
        works = True
    except RuntimeError as exc:
        assert "Dynamo is not supported" in str(exc)
        works = False
    assert works == torch_support.compile_supported()
