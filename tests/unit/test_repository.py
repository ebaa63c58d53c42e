"""What the repository holds: source and text, no binaries (a wheel, a bundle, a compiled module came in once with an
unrelated commit), and the demo data that is the one binary it ships, named here."""

import subprocess

import pytest

from tests.support import REPO

BINARY_DATA = {"data/demo.biom": "the demo table (HDF5): the quickstart's default data"}
PACKAGES = (".whl", ".tar.gz", ".tgz", ".zip", ".egg", ".so", ".pyd", ".dll", ".pyc", ".pt", ".pth", ".ckpt", ".npy")
MAX_TEXT_BYTES = 400_000  # the largest text file is far below (a generated or vendored file is not source)


def tracked() -> list[str]:
    try:
        done = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        done = None
    if done is None or done.returncode != 0:
        pytest.skip("not a git checkout: the repository's files cannot be listed")
    return [name for name in done.stdout.decode().split("\0") if name]


def is_binary(path) -> bool:
    with open(path, "rb") as handle:
        return b"\0" in handle.read(8192)


def test_no_binary_file_is_committed():
    files = tracked()
    assert "pyproject.toml" in files and "debug_nan/__init__.py" in files  # (the listing is the repository's)
    archives = [name for name in files if name.lower().endswith(PACKAGES)]
    assert not archives, f"packages or binaries committed: {archives}"
    binaries = [name for name in files if name not in BINARY_DATA and (REPO / name).is_file()
                and is_binary(REPO / name)]
    assert not binaries, f"binary files committed (add real data to BINARY_DATA with its reason): {binaries}"
    large = [name for name in files if (REPO / name).is_file() and name not in BINARY_DATA
             and (REPO / name).stat().st_size > MAX_TEXT_BYTES]
    assert not large, f"files over {MAX_TEXT_BYTES:,} bytes committed: {large}"


def test_the_check_sees_a_binary(tmp_path):
    (tmp_path / "a.whl").write_bytes(b"PK\x03\x04\0\0")
    (tmp_path / "a.py").write_text("x = 1\n")
    assert is_binary(tmp_path / "a.whl") and not is_binary(tmp_path / "a.py")
    assert "pyflakes-4.1.0-py2.py3-none-any.whl".endswith(PACKAGES)
