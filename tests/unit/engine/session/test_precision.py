"""engine/session/precision.py: the autocast state read and re-entered exactly, the loss scale's overflow rule,
and the one line a run of skipped steps is."""

from types import SimpleNamespace

import pytest
import torch

from debug_nan.engine.session.precision import (
    SKIPS_FINDING,
    SkipRun,
    autocast_as,
    autocast_state,
    may_overflow,
    scale_words,
)


def test_the_autocast_state_in_force_nested_regions_and_a_decorator():
    assert autocast_state() == ()
    with torch.autocast("cpu", dtype=torch.bfloat16, cache_enabled=False):
        assert autocast_state() == (("cpu", torch.bfloat16, False),)
        with torch.autocast("cpu", enabled=False):
            assert autocast_state() == ()

    @torch.autocast("cpu", dtype=torch.bfloat16)
    def decorated():
        return autocast_state()

    assert decorated() == (("cpu", torch.bfloat16, True),)


def test_a_state_is_re_entered_exactly_and_left_as_it_was():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with autocast_as(()):
            assert autocast_state() == () and (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float32
        assert autocast_state() == (("cpu", torch.bfloat16, True),)
    with autocast_as((("cpu", torch.bfloat16, True),)):
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    assert autocast_state() == ()
    with torch.autocast("cpu", dtype=torch.bfloat16), autocast_as(None):  # not recorded (an older bundle): as is
        assert autocast_state() == (("cpu", torch.bfloat16, True),)


@pytest.mark.parametrize("scale, overflow", [(65536.0, True), (2.0, True), (1.0, False), (0.25, False)])
def test_only_a_scale_above_1_can_overflow_what_is_finite_without_it(scale, overflow):
    assert may_overflow(torch.amp.GradScaler("cpu", init_scale=scale)) is overflow
    assert not may_overflow(None)


def test_scales_as_the_log_shows_them():
    assert [scale_words(s) for s in (65536.0, 1.7e7, 2.6e5, 0.5, 1.7e38)] == ["65536", "1.7e7", "2.6e5", "0.5",
                                                                            "1.7e38"]


def _skip(run, step, scale, scaler):
    o = SimpleNamespace(inputs=SimpleNamespace(step=step), micro=1, record=SimpleNamespace(loss_scale=scale),
                        check=SimpleNamespace(nonfinite="inf"))
    return run.add(o, scaler)


def test_a_run_of_skipped_steps_is_one_line_and_a_long_one_a_finding():
    scaler, lines, run = torch.amp.GradScaler("cpu"), [], SkipRun()
    assert all(_skip(run, s, 65536.0 / 2 ** (s - 1), scaler) is None for s in range(1, 4))
    run.end(lines.append)
    run.end(lines.append)  # (nothing open: no line)
    assert lines == ["  [scaler] steps 1-3 skipped by the GradScaler: scale 65536 -> 8192 (gradients finite at "
                     "scale 1: the loss scale's overflow, not a finding)"]
    _skip(run, 7, 4096.0, scaler)
    run.end(lines.append)
    assert lines[-1].startswith("  [scaler] step 7 skipped by the GradScaler: scale 4096 -> 2048")
    findings = [_skip(run, s, 2.0 ** 120, scaler) for s in range(10, 10 + SKIPS_FINDING)]
    assert findings[:-1] == [None] * (SKIPS_FINDING - 1)
    f = findings[-1]
    assert (f.step, f.phase, f.cause, f.kind) == (10 + SKIPS_FINDING - 1, "backward", "overflow", "inf")
    assert f"skipped {SKIPS_FINDING} steps in a row (steps 10-{9 + SKIPS_FINDING})" in f.explanation
