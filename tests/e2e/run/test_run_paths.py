"""`debug-nan run`'s outputs never land on a file of the user's command: paths are absolute from the start (a
script that chdirs does not move them), an existing file that is not debug-nan's is refused (exit 2), and a path
the command opened or imported while it ran gets the output beside it (app/run_paths.py; the rule alone:
tests/unit/app/test_run_paths.py)."""

import json

import pytest

from tests.support.run.side_by_side import TRAIN, plain

CHDIR = """import os
os.chdir("work")
with open("results.json") as f:
    print(f.read(), flush=True)
""" + TRAIN

WRITES = TRAIN + """
with open("results.json", "w") as f:
    f.write("the script's own results")
"""

IMPORTS = """import helper
""" + TRAIN + """print(helper.X)
"""


def test_relative_outputs_stay_where_debug_nan_started_when_the_script_chdirs(tmp_path, run_here):
    (tmp_path / "work").mkdir()
    (tmp_path / "work" / "results.json").write_text('{"data": 1}')
    (tmp_path / "train.py").write_text(CHDIR)
    alone = plain("train.py", cwd=tmp_path)
    done, stdout, stderr = run_here("python", "train.py", report="results.json", options=("--log", "debug.log"))
    report = done.report
    assert (alone.returncode, done.code) == (0, 0), stderr
    assert stdout == alone.stdout and alone.stdout.startswith('{"data": 1}\nstep 0 loss')
    assert (tmp_path / "work" / "results.json").read_text() == '{"data": 1}'
    assert (report["status"], report["steps_run"]) == ("clean", 3)
    assert (tmp_path / "debug.log").read_text().startswith("[debug-nan] run: python train.py")
    assert sorted(p.name for p in (tmp_path / "work").iterdir()) == ["results.json"]


@pytest.mark.parametrize("option", ["--log", "--report"])
def test_an_output_naming_a_module_the_script_imports_is_refused_and_the_module_untouched(tmp_path, run_here,
                                                                                          option):
    (tmp_path / "helper.py").write_text("X = 5\n")
    (tmp_path / "train.py").write_text(IMPORTS)
    options = ("--log", "helper.py") if option == "--log" else ()
    done, stdout, stderr = run_here("python", "train.py", options=options,
                                    report="helper.py" if option == "--report" else "run.json")
    assert done.code == 2 and stdout == "", stderr
    assert f"{option} {tmp_path / 'helper.py'} already exists and is not an earlier debug-nan output" in " ".join(
        stderr.split())
    assert (tmp_path / "helper.py").read_text() == "X = 5\n"


def test_a_file_the_script_writes_at_the_report_path_is_kept_and_the_report_goes_beside_it(tmp_path, run_here):
    (tmp_path / "train.py").write_text(WRITES)
    alone = plain("train.py", cwd=tmp_path)
    (tmp_path / "results.json").unlink()
    done, stdout, stderr = run_here("python", "train.py", report="results.json", options=("--log", "results.json.log"))
    assert done.code == 0 and stdout == alone.stdout, stderr
    assert (tmp_path / "results.json").read_text() == "the script's own results"
    moved = tmp_path / "results.debug-nan.json"
    assert json.loads(moved.read_text())["steps_run"] == 3
    assert (f"--report {tmp_path / 'results.json'}: not written there (the command opened it while it ran); "
            f"written to {moved} instead.") in " ".join(stderr.split())


def test_an_earlier_debug_nan_log_and_report_are_replaced(tmp_path, run_here):
    (tmp_path / "train.py").write_text(TRAIN)
    run_here("python", "train.py", report="r.json", options=("--log", "d.log"))
    first = (tmp_path / "d.log").read_text()
    done, _, stderr = run_here("python", "train.py", report="r.json", options=("--log", "d.log"))
    assert done.code == 0 and done.report["steps_run"] == 3, stderr
    assert (tmp_path / "d.log").read_text().count("[debug-nan] run:") == 1 == first.count("[debug-nan] run:")
    assert not list(tmp_path.glob(".*partial"))
