"""An output path the user's command imported goes beside it, said so (app/run_paths.py)."""

from debug_nan.app import run_paths as paths


def test_an_output_path_the_command_imported_goes_beside_it():
    import tests.support.run.side_by_side as module

    said = []
    moved = paths.destination(module.__file__, "--log", None, said.append)
    assert moved == module.__file__[:-3] + ".debug-nan.py"
    assert "(the command imported it (module tests.support.run.side_by_side))" in said[0]
