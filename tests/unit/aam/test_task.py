"""The built-in task's data: synthetic only when no data was asked for, and said why (aam/task.py)."""

from __future__ import annotations

import pytest

# --- writers: build the inputs of one case ------------------------------------------------------------------------


# --- the cases ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("make_data_folder, reason", [
    (False, "No --table given and ./data (the default --data-dir) does not exist: synthesized 4 samples"),
    (True, "No --table given and ./data (the default --data-dir) has no *.biom table: synthesized 4 samples"),
])
def test_synthetic_data_only_when_no_data_was_asked_for(tmp_path, monkeypatch, make_data_folder, reason):
    from debug_nan.aam.task import load_or_synthesize
    from debug_nan.aam.settings import AAMData

    monkeypatch.chdir(tmp_path)
    if make_data_folder:
        (tmp_path / "data").mkdir()
        (tmp_path / "data" / "README.txt").write_text("x")
    lines = []
    data = load_or_synthesize(AAMData(synthetic_samples=4, token_limit=8), 42, lines.append)
    assert data.source == "synthetic" and data.notes[0].startswith(reason)
    assert lines[0].startswith("Synthesizing 4 samples x 64 ASVs")
