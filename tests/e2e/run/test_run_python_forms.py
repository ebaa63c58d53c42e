"""`debug-nan run -- python X` runs X as `python X` does: a script through a symlink (its neighbours import from
the real file's folder), a folder or a .zip with a `__main__.py`; sys.argv[0], `__file__` and sys.path[0] as
Python sets them; and a script's own traceback is the one `python X` prints (no runpy or debug-nan frames). Each form
runs alone in a fresh process (what Python gives it) and watched in this one (what debug-nan gives it)."""

import os
import zipfile

import pytest

from tests.support.run.side_by_side import TRAIN, plain

SHOWS = """import sys

import neighbour

print("argv", sys.argv, "file", __file__, "path0", sys.path[0], "spec", __spec__ and __spec__.name, flush=True)
""" + TRAIN + """sys.exit(neighbour.CODE)
"""

RAISES = TRAIN + """

def check(step):
    raise ValueError(f"step {step} is not finite enough")


try:
    {}["missing"]
except KeyError:
    check(3)
"""


@pytest.fixture
def forms(tmp_path):
    """real/train.py (and its neighbour), link.py -> real/train.py, app/ and app.zip with a __main__.py."""
    for folder in ("real", "app"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "neighbour.py").write_text("CODE = 3\n")
    (tmp_path / "real" / "train.py").write_text(SHOWS)
    (tmp_path / "app" / "__main__.py").write_text(SHOWS)
    os.symlink(tmp_path / "real" / "train.py", tmp_path / "link.py")
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as archive:
        archive.writestr("__main__.py", SHOWS)
        archive.writestr("neighbour.py", "CODE = 3\n")
    return tmp_path


@pytest.mark.parametrize("typed", ["real/train.py", "./real/../real/train.py", "link.py", "app/", "app.zip"])
def test_each_form_sees_what_python_gives_it(forms, run_here, typed):
    alone = plain(typed, cwd=forms)
    done, stdout, stderr = run_here("python", typed)
    assert alone.returncode == 3 and alone.stdout.startswith(f"argv ['{typed}'] file "), alone.stderr
    assert done.code == 3, stderr
    assert stdout == alone.stdout
    assert (done.report["status"], done.report["steps_run"]) == ("clean", 3)


def test_the_scripts_traceback_is_the_one_python_prints(tmp_path, run_here):
    (tmp_path / "train.py").write_text(RAISES)
    alone = plain("train.py", cwd=tmp_path)
    done, stdout, stderr = run_here("python", "train.py")
    assert alone.returncode == 1 and done.code == 1, stderr
    assert stdout == alone.stdout
    assert alone.stderr.startswith("Traceback") and alone.stderr.endswith("ValueError: step 3 is not finite enough\n")
    assert "During handling of the above exception" in alone.stderr
    assert alone.stderr in stderr  # the same block, frame for frame
    assert "<frozen runpy>" not in stderr and "debug_nan" not in stderr
    assert done.report["status"] == "error"
