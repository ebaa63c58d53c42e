"""The history: per-step records, the gradient-explosion check, and the notes on harmless NaN/Inf."""

import math

import numpy as np

from debug_nan.engine.watch.history import MAX_RUNS, History
from debug_nan.engine.watch.watch_result import MicroResult, Segment


def result(outputs: dict[str, tuple[float, float]] | None = None, loss: float = 1.0,
           grads: dict[str, float] | None = None, data: dict[str, tuple[float, float]] | None = None) -> MicroResult:
    """A MicroResult as the watch's sync builds it: (min, max) per module output / batch key."""
    segments = []
    for kind, pairs in (("data", data or {}), ("forward", outputs or {})):
        if pairs:
            lo = np.array([p[0] for p in pairs.values()])
            hi = np.array([p[1] for p in pairs.values()])
            value = np.where(np.isnan(lo) | np.isnan(hi), np.nan, np.maximum(-lo, hi))
            segments.append(Segment(kind, list(pairs), value, ~(np.isfinite(lo) & np.isfinite(hi)), lo, hi))
    segments.append(Segment("loss", [""], np.array([loss]), ~np.isfinite(np.array([loss]))))
    grads = grads or {"w": 1.0}
    values = np.array(list(grads.values()))
    segments.append(Segment("grad", list(grads), values, ~np.isfinite(values)))
    return MicroResult(segments)


def run(history: History, steps: range, make) -> None:
    for step in steps:
        rec = history.begin(step)
        history.add_micro(rec, make(step), last=True)
        rec.finish()


def test_minus_inf_every_step_is_a_note_that_it_never_reached_harm():
    h = History()
    run(h, range(1, 11), lambda s: result({"block.bias": (-math.inf, 0.0), "block.proj": (-2.0, 3.0)}))
    assert h.nonfinite_notes() == ["`block.bias` output holds -inf in every step (1..10); it never reached the "
                                   "loss, a gradient or a parameter"]
    assert h.steps[3].activations == {"block.bias": math.inf, "block.proj": 3.0}


def test_notes_name_nan_and_both_infs_in_step_ranges_and_batch_keys():
    h = History()

    def make(step):
        out = {"a": (math.nan, math.nan) if step in (2, 3, 4, 7) else (0.0, 1.0),
               "b": (-math.inf, math.inf) if step == 5 else (0.0, 1.0)}
        return result(out, data={"y": (math.nan, math.nan)} if step == 1 else {"y": (0.0, 1.0)})

    run(h, range(1, 9), make)
    assert h.nonfinite_notes() == [
        "`y` batch key holds NaN in step 1; it never reached the loss, a gradient or a parameter",
        "`a` output holds NaN in steps 2..4, 7; it never reached the loss, a gradient or a parameter",
        "`b` output holds +inf and -inf in step 5; it never reached the loss, a gradient or a parameter",
    ]


def test_a_note_says_when_harm_followed_in_the_same_step():
    h = History()
    run(h, range(1, 4), lambda s: result({"attn": (math.nan, math.nan)} if s == 3 else {"attn": (0.0, 1.0)},
                                         loss=math.nan if s == 3 else 1.0))
    assert h.nonfinite_notes() == ["`attn` output holds NaN in step 3; in step 3 the loss, a gradient or a "
                                   "parameter also went non-finite (see the finding)"]


def test_note_memory_is_bounded_on_long_runs():
    h = History()
    run(h, range(1, 1001), lambda s: result({"m": (-math.inf, 0.0) if s % 3 == 0 else (0.0, 1.0)}))
    series = h.nonfinite[("output", "m")]
    assert len(series.runs) == MAX_RUNS and series.steps == 333 and series.last == 999
    [note] = h.nonfinite_notes()
    assert note.startswith("`m` output holds -inf in steps 3, 6, 9,") and "and 317 later step(s) up to 999" in note


def test_explosion_history_uses_the_gradient_l2_norms():
    h = History()
    norms = [1.0, 2.0, 5e4]
    run(h, range(1, 4), lambda s: result(grads={"a.weight": norms[s - 1] * 0.6, "b.weight": norms[s - 1] * 0.8}))
    assert [r.grad_norm for r in h.steps] == [1.0, 2.0, 5e4]
    rec, floor = h.explosion(threshold=1e4, growth=1e3)
    assert rec.step == 3 and floor == 1.0
    assert h.steps[2].grad_norms == {"a.weight": 3e4, "b.weight": 4e4}


def test_nan_spreading_downstream_of_a_finding_is_one_note_not_one_per_module():
    h = History()
    layers = {f"layer{i}": (math.nan, math.nan) for i in range(40)}
    run(h, range(1, 2), lambda s: result(layers, loss=math.nan))
    assert h.nonfinite_notes() == ["40 module outputs / batch keys held NaN/Inf in the step(s) of the finding "
                                   "(downstream of it), e.g. `layer0`, `layer1`, `layer2`"]


def test_harmless_outputs_are_listed_up_to_a_bound():
    h = History()
    run(h, range(1, 3), lambda s: result({f"mask{i}": (-math.inf, 0.0) for i in range(13)}))
    notes = h.nonfinite_notes()
    assert len(notes) == 11 and notes[0].startswith("`mask0` output holds -inf in every step (1..2)")
    assert notes[-1] == "... and 3 more outputs like these"
