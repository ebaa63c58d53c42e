"""Quiet failures read from the history (engine/watch/quiet.py)."""

from debug_nan.engine.watch.history import History
from debug_nan.engine.watch.quiet import quiet_warnings


def _history(*records: dict) -> History:
    h = History()
    for i, fields in enumerate(records, start=1):
        rec = h.begin(i)
        rec.micro_batches = 1
        for k, v in fields.items():
            setattr(rec, k, v)
    return h


def test_a_healthy_history_has_no_warning():
    assert quiet_warnings(_history({"grad_norm": 1.0}, {"grad_norm": 0.5, "activations": {"a": 3.0}})) == []


def test_zero_gradient_needs_three_steps_in_a_row():
    assert quiet_warnings(_history({"grad_norm": 0.0}, {"grad_norm": 0.0}, {"grad_norm": 1.0})) == []
    out = quiet_warnings(_history({"grad_norm": 1.0}, *[{"grad_norm": 0.0}] * 3))
    assert len(out) == 1 and "exactly 0 in steps 2..4" in out[0]


def test_scaler_skipping_some_steps_is_normal_every_step_is_not():
    assert quiet_warnings(_history({"scaler_skipped": True}, {"grad_norm": 1.0})) == []
    assert quiet_warnings(_history({"scaler_skipped": True})) == []  # one step says nothing yet
    out = quiet_warnings(_history({"scaler_skipped": True}, {"scaler_skipped": True}))
    assert len(out) == 1 and "skipped every step (1..2)" in out[0]


def test_huge_finite_activations_but_not_mask_constants():
    h = _history({"activations": {"mask": 3.4028234663852886e38, "half_mask": 1.7014117e38, "blk": 5e21}},
                 {"activations": {"blk": 2e22, "nan": float("nan"), "inf": float("inf")}})
    out = quiet_warnings(h)
    assert len(out) == 1 and out[0].startswith("`blk` output reached max |x| = 2e+22 at step 2")


def test_a_note_never_says_never_reached_when_harm_came_later():
    import numpy as np

    from debug_nan.engine.watch.watch_result import MicroResult, Segment

    h = History()
    for step, (out, loss) in enumerate([(np.nan, 1.0), (1.0, np.nan)], start=1):
        rec = h.begin(step)
        lo = np.array([out])
        h.add_micro(rec, MicroResult([Segment("forward", ["vq"], np.array([out]), ~np.isfinite(lo), lo, lo),
                                      Segment("loss", [""], np.array([loss]), ~np.isfinite(np.array([loss])))]), True)
    (note,) = h.nonfinite_notes()
    assert note == ("`vq` output holds NaN in step 1; the loss, gradients and parameters stayed finite in those "
                    "steps (harm came at step 2: see the finding)")
