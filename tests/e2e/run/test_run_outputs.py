"""`debug-nan run`'s outputs: the history table, --plot and --tensorboard as the job writes them; a report that
cannot be written at the end (a full disk) exits 2 with the reason, as every entry point does; the script's own
output is unchanged."""

import errno
import os
import shutil
import subprocess
import sys

import pytest

from tests.support.run.side_by_side import TRAIN, env
from tests.support.tensorboard import read_back, values

PNG = b"\x89PNG\r\n\x1a\n"
# TRAIN whose third step's loss is multiplied by a NaN: a loss-phase finding at step 3
BROKEN = TRAIN.replace(".pow(2).mean()", ".pow(2).mean() * (float('nan') if step == 2 else 1.0)")


def test_plot_tensorboard_and_the_history_table_of_a_healthy_run(tmp_path, run_here, train_alone):
    pytest.importorskip("matplotlib")
    pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    (tmp_path / "train.py").write_text(TRAIN)
    done, stdout, stderr = run_here("python", "train.py", options=("--plot", "p.png", "--tensorboard", "tb"))
    assert done.code == 0 and stdout == train_alone.stdout, done.output
    assert (tmp_path / "p.png").read_bytes().startswith(PNG)
    history = done.report["history"]
    assert [h["step"] for h in history] == [1, 2, 3]
    acc = read_back(tmp_path / "tb")
    assert values(acc, "loss") == [(h["step"], pytest.approx(h["loss"], rel=1e-6)) for h in history]
    assert [s for s, _ in values(acc, "grad_norm/total")] == [1, 2, 3] and "grad_norm/0" in acc.Tags()["scalars"]
    table = stderr[stderr.index("=== HISTORY (per layer, 3 step(s))"):stderr.index("=== SUMMARY")]
    assert [line.split()[:2] for line in table.splitlines()[3:5]] == [["0", "(Linear)"], ["2", "(Linear)"]]
    assert stderr.index("CLEAN: 3 step(s)") < stderr.index(f"heat map written to {tmp_path / 'p.png'}")
    assert done.report["schema_version"] == 1
    assert done.report["settings"]["plot"] == str(tmp_path / "p.png") and "token_limit" not in done.report["settings"]


def test_plot_and_tensorboard_of_a_run_with_a_finding(tmp_path, run_here):
    pytest.importorskip("matplotlib")
    pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")
    (tmp_path / "train.py").write_text(BROKEN)
    done, _, stderr = run_here("python", "train.py", options=("--plot", "p.png", "--tensorboard", "tb",
                                                             "--history", "full"))
    assert done.code == 1 and (done.first["step"], done.first["phase"]) == (3, "loss"), done.output
    assert (tmp_path / "p.png").read_bytes().startswith(PNG)
    acc = read_back(tmp_path / "tb")
    assert [s for s, _ in values(acc, "loss")][:2] == [1, 2]
    finding = acc.Tensors("finding/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "where        step 3, micro-batch 1, phase loss" in finding
    assert "=== HISTORY (per layer, 3 step(s))" in stderr and done.report["settings"]["history"] == "full"


def test_a_plot_path_that_is_not_a_debug_nan_plot_is_refused(tmp_path, run_here):
    """--plot follows --report's rule: an existing file there must be an earlier debug-nan output."""
    pytest.importorskip("matplotlib")
    (tmp_path / "train.py").write_text(TRAIN)
    (tmp_path / "figure.png").write_bytes(PNG + b"the user's own figure")
    done, stdout, stderr = run_here("python", "train.py", options=("--plot", "figure.png"))
    assert done.code == 2 and stdout == "" and (tmp_path / "figure.png").read_bytes().endswith(b"own figure")
    assert f"--plot {tmp_path / 'figure.png'} already exists and is not an earlier debug-nan output" in \
        " ".join(stderr.split())
    done, _, _ = run_here("python", "train.py", options=("--plot", "p.png"))
    done, _, _ = run_here("python", "train.py", options=("--plot", "p.png"))  # its own plot: replaced
    assert done.code == 0 and (tmp_path / "p.png").read_bytes().startswith(PNG), done.output


def test_a_full_disk_for_the_report_exits_2_with_the_reason(tmp_path, run_here, monkeypatch, train_alone):
    """The report's real atomic write, its fsync failing as a full disk's does."""
    import debug_nan.presentation.outputs as outputs

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    (tmp_path / "train.py").write_text(TRAIN)
    monkeypatch.setattr(outputs.os, "fsync", full)
    done, stdout, stderr = run_here("python", "train.py")
    assert done.code == 2 and done.report is None, done.output
    assert stdout == train_alone.stdout
    reason = (f"--report {tmp_path / 'run.json'}: could not be written (No space left on device); nothing was left "
              f"half-written there.")
    said = " ".join(stderr.split())  # as the job says it: a note in the summary, then the error line
    assert f"note The run itself ended with exit 0; exit 2 because an output could not be written: {reason}" in said
    assert said.endswith(f"debug-nan: error: {reason}")
    assert not list(tmp_path.glob(".*partial"))


@pytest.fixture
def full_disk(tmp_path):
    """A 16 KiB tmpfs filled to the last byte (root only: skipped where mount is not allowed)."""
    mount = tmp_path / "full"
    mount.mkdir()
    if os.geteuid() != 0 or not shutil.which("mount") or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(mount)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here")
    try:
        fd = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(fd, b"x" * 512):
                pass
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
        finally:
            os.close(fd)
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True)


@pytest.mark.processes
def test_a_report_on_a_full_file_system_exits_2(tmp_path, full_disk, train_alone):
    (tmp_path / "train.py").write_text(TRAIN)
    report = full_disk / "run.json"
    done = subprocess.run([sys.executable, "-m", "debug_nan", "run", "--report", str(report), "--", "python",
                           "train.py"], cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr
    assert done.stdout == train_alone.stdout
    assert f"--report {report}: could not be written (No space left on device)" in " ".join(done.stderr.split())
    assert sorted(p.name for p in full_disk.iterdir()) == ["filler"]
