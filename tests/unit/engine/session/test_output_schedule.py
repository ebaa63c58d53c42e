"""When module outputs are measured: every step up to WARM_STEPS, then on a stride chosen from what measuring them
costs (CPU), every step on CUDA, or every N steps when fixed. Module outputs never trip, so the findings do not
depend on it (checked through the CLI: tests/e2e/cli/test_output_schedule.py)."""

import pytest

from debug_nan.engine.session import output_schedule as schedule_module
from debug_nan.engine.session.output_schedule import MAX_OUTPUTS_EVERY, WARM_STEPS, OutputSchedule


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def run_steps(schedule: OutputSchedule, clock: FakeClock, steps: range, step_s: float, hooks_s: float) -> list[int]:
    """Drive the schedule like the session: begin, a step of `step_s` seconds (of which `hooks_s` in the hooks when
    measured), the optimizer step -> the steps measured."""
    measured = []
    for step in steps:
        on = schedule.begin()
        clock.now += step_s
        schedule.stepped(hooks_s if on else 0.0, 0)
        if on:
            measured.append(step)
    return measured


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(schedule_module.time, "perf_counter", fake)
    return fake


def test_adaptive_measures_every_warm_step_then_keeps_the_cost_under_half_a_percent(clock):
    lines = []
    s = OutputSchedule(None, adaptive=True, log=lambda line="", colour=None: lines.append(line))
    # 1.8% of a step in the hooks: every 4th step costs 0.45%
    measured = run_steps(s, clock, range(1, 41), step_s=0.1, hooks_s=0.0018)
    assert measured == list(range(1, WARM_STEPS + 1)) + [20, 24, 28, 32, 36, 40]
    assert s.every == 4
    assert len(lines) == 1 and "1.8% of a step" in lines[0] and "every 4 steps" in lines[0]


def test_the_adaptive_stride_is_a_power_of_two_and_counts_the_runs_own_steps(clock):
    """A resumed run (steps 5001..) measures its own first 16 steps; 2.6% of a step needs every 6th: every 8th."""
    s = OutputSchedule(None, adaptive=True)
    measured = run_steps(s, clock, range(5001, 5041), step_s=0.1, hooks_s=0.0026)
    assert s.every == 8
    assert measured == list(range(5001, 5017)) + [5024, 5032, 5040]


def test_adaptive_stays_on_every_step_when_measuring_is_cheap(clock):
    s = OutputSchedule(None, adaptive=True)
    assert run_steps(s, clock, range(1, 31), step_s=0.1, hooks_s=0.00045) == list(range(1, 31))


def test_adaptive_stride_is_capped(clock):
    s = OutputSchedule(None, adaptive=True)
    run_steps(s, clock, range(1, 60), step_s=0.1, hooks_s=0.05)  # half the step (a model of tiny layers)
    assert s.every == MAX_OUTPUTS_EVERY


def test_not_adaptive_measures_every_step(clock):  # CUDA: the reductions are queued on the device
    s = OutputSchedule(None, adaptive=False)
    assert run_steps(s, clock, range(1, 41), step_s=0.1, hooks_s=0.05) == list(range(1, 41))


def test_a_fixed_stride_starts_at_the_first_step(clock):
    s = OutputSchedule(3, adaptive=True)
    assert run_steps(s, clock, range(1, 11), step_s=0.1, hooks_s=0.05) == [1, 4, 7, 10]
    assert s.every == 3


def test_zero_is_chosen_and_a_negative_stride_is_refused(clock):
    assert OutputSchedule(0, adaptive=True).adaptive
    with pytest.raises(ValueError, match="outputs_every=-2"):
        OutputSchedule(-2, adaptive=True)


def test_a_note_counts_the_later_steps_beyond_its_ranges_in_measured_steps():
    """Outputs measured every 4th step, a mask held in each, then broken up: the ranges stop at MAX_RUNS and the
    rest are counted as steps, not as the step numbers they span."""
    from debug_nan.engine.watch.history import MAX_RUNS, NonfiniteSeries

    series, previous = NonfiniteSeries("output", "attn"), None
    measured = list(range(4, 4 * 99 + 1, 4))  # 99 measured steps
    held = [step for i, step in enumerate(measured) if i % 3 != 2]  # two measured steps held, one not: 33 ranges
    for step in measured:
        if step in held:
            series.add(step, "-inf", previous)
        previous = step
    assert series.runs[0] == [4, 8] and len(series.runs) == MAX_RUNS  # a range spans an unmeasured step number
    text = series.describe_steps(measured[0], measured[-1], len(measured))
    assert f"and {len(held) - 2 * MAX_RUNS} later step(s) up to {held[-1]}" in text
    assert f"({len(held)} of the {len(measured)} steps whose outputs were measured)" in text


def test_the_cost_counts_each_hooked_call_besides_the_hooks_own_time(clock):
    """900 hooked calls a step at HOOK_CALL_SECONDS (4 us): 3.6 ms of a 100 ms step, with no time in the hooks."""
    from debug_nan.engine.session.output_schedule import HOOK_CALL_SECONDS

    s = OutputSchedule(None, adaptive=True)
    for _ in range(WARM_STEPS):
        s.begin()
        clock.now += 0.1
        s.stepped(0.0, 900)
    # 3.6% needs every 8th step (7.2, rounded up to a power of two) for 0.5%
    assert HOOK_CALL_SECONDS == 4e-6 and s.every == 8
