"""A `debug-nan run` report that cannot be written at the end (a full disk) exits 2 with the reason, as every
entry point does; the script's own output is unchanged."""

import errno
import os
import shutil
import subprocess
import sys

import pytest

from tests.support.run.side_by_side import TRAIN, env


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
    assert (f"debug-nan: error: --report {tmp_path / 'run.json'}: could not be written (No space left on device); "
            f"nothing was left half-written there. The run itself ended with exit 0; exit 2 because its report "
            f"could not be written.") in " ".join(stderr.split())
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
