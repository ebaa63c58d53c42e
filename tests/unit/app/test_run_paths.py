"""Which existing files debug-nan may replace, and an output path the user's command imported goes beside it, said
so (app/run_paths.py)."""

import pytest

from debug_nan.app import run_paths as paths
from debug_nan.errors import InputError


def test_an_output_path_the_command_imported_goes_beside_it():
    import tests.support.run.side_by_side as module

    said = []
    moved = paths.destination(module.__file__, "--log", None, said.append)
    assert moved == module.__file__[:-3] + ".debug-nan.py"
    assert "(the command imported it (module tests.support.run.side_by_side))" in said[0]


def test_which_existing_files_debug_nan_may_replace(tmp_path):
    cases = {"empty": ("", "--log", True), "log": ("[debug-nan] run: x\n", "--log", True),
             "data.csv": ("a,b\n", "--log", False), "ours.json": ('{"status": "clean", "debug_nan": "0.1"}',
                                                                  "--report", True),
             "theirs.json": ('{"status": "clean"}', "--report", False), "bad.json": ("{", "--report", False)}
    for name, (text, option, ok) in cases.items():
        (tmp_path / name).write_text(text)
        assert paths.replaceable(str(tmp_path / name), option) is ok, name
    with pytest.raises(InputError, match="data.csv already exists"):
        paths.refuse_foreign({"--log": str(tmp_path / "data.csv")})
    paths.refuse_foreign({"--log": str(tmp_path / "log"), "--report": str(tmp_path / "new.json")})
