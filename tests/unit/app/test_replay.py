"""An interrupted replay of a bundle whose cause this version does not declare keeps its words (app/replay.py)."""

from __future__ import annotations


def test_an_interrupted_replay_of_a_bundle_with_an_unknown_cause_keeps_its_words():
    """A bundle from a newer debug-nan may name a cause this version does not declare: an interrupt during its
    replay still gives a result (no traceback from inside the interrupt's handler)."""
    from debug_nan.app.replay import interrupted_result

    finding = dict(step=2, micro_step=1, phase="forward", module="m", module_type="Linear", op="aten.mm.default",
                   kind="nan", cause="some_new_cause", explanation="e", source=None, suggestions=[])
    result = interrupted_result({"finding": finding}, KeyboardInterrupt(), [])
    assert (result.status, result.finding, result.interrupted, result.exit_code) == ("error", None, True, 130)
