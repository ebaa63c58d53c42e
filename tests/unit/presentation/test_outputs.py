"""Atomic writes (presentation/outputs.py): a failed write keeps the old file, and a write through a symlink keeps
the link and the file's mode."""

from __future__ import annotations

import os

import pytest


def test_atomic_write_keeps_the_old_file_when_the_write_fails(tmp_path):
    from debug_nan.presentation.outputs import OutputWriteError, atomic_write

    target = tmp_path / "r.json"
    target.write_text("old")

    def half_then_fail(handle):
        handle.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputWriteError, match="No space left on device"):
        atomic_write(target, half_then_fail, "--report")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["r.json"]


def test_atomic_write_through_a_symlink_keeps_the_link_and_the_mode(tmp_path):
    from debug_nan.presentation.outputs import write_text_atomic

    real = tmp_path / "real.json"
    real.write_text("old")
    os.chmod(real, 0o640)
    (tmp_path / "link.json").symlink_to(real)
    write_text_atomic(tmp_path / "link.json", "new", "--report")
    assert (tmp_path / "link.json").is_symlink() and real.read_text() == "new"
    assert real.stat().st_mode & 0o777 == 0o640
