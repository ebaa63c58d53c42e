"""Quiet failures: runs that stay finite but do not train, or sit at the edge of overflowing. Read from the
history after the run (no work on the hot path); each is a warning in the summary and the JSON report.

  * every step skipped by the fp16 GradScaler: the model never updated;
  * a total gradient norm of exactly 0 for several steps in a row: nothing learns (a detached graph, dead ReLUs,
    a loss that does not depend on the parameters, every label ignored);
  * a module output whose max |x| reached 1e20 while finite: its square (a variance, a norm, an L2 loss) already
    overflows float32 (3.4e38), and fp16/bf16 autocast or a few more steps turn it into Inf. Values of at least
    half the float32 maximum are left out: they are mask constants (torch.finfo(float32).min, min / 2), not growth.
"""

from __future__ import annotations

from debug_nan.engine.watch.history import History

ZERO_GRAD_STEPS = 3  # consecutive steps with a gradient norm of exactly 0
HUGE_ACTIVATION = 1e20
MASK_CONSTANT = 3.4028234663852886e38 / 2 * 0.999  # finfo(float32).max / 2: a mask value, not an activation


def _steps(values: list[int]) -> str:
    return f"{values[0]}..{values[-1]}" if len(values) > 1 else str(values[0])


def quiet_warnings(history: History) -> list[str]:
    steps = [r for r in history.steps if r.micro_batches]
    out = []
    skipped = [r.step for r in steps if r.scaler_skipped]
    if len(steps) >= 2 and len(skipped) == len(steps):
        out.append(f"the fp16 GradScaler skipped every step ({_steps(skipped)}): the scaled gradients overflowed fp16 "
                   f"each time, so the model never updated. Gradients that large for fp16 "
                   f"(a loss summed instead of averaged, an unnormalised target) need a smaller GradScaler "
                   f"init_scale, a mean loss, or --precision bf16.")
    run: list[int] = []
    longest: list[int] = []
    for r in steps:
        run = run + [r.step] if r.grad_norm == 0.0 else []
        longest = run if len(run) > len(longest) else longest
    if len(longest) >= ZERO_GRAD_STEPS:
        out.append(f"the total gradient norm was exactly 0 in steps {_steps(longest)}: nothing is learning (a graph "
                   f"detached from the parameters, dead ReLUs, a loss that does not depend on them, every label "
                   f"ignored). Check that loss.backward() reaches the parameters and that the batches carry targets.")
    huge: dict[str, tuple[float, int]] = {}
    for r in steps:
        for name, value in r.activations.items():
            if HUGE_ACTIVATION <= value < MASK_CONSTANT and value > huge.get(name, (0.0, 0))[0]:
                huge[name] = (value, r.step)
    for name, (value, step) in sorted(huge.items(), key=lambda kv: -kv[1][0])[:3]:
        out.append(f"`{name or '<model>'}` output reached max |x| = {value:.3g} at step {step}, still finite: its "
                   f"square (a variance, a norm, an L2 loss) overflows float32 (3.4e38) and fp16 overflows at 65504. "
                   f"Normalise before it or find why it grew (the history table shows where).")
    if len(huge) > 3:
        out.append(f"... and {len(huge) - 3} more module outputs above {HUGE_ACTIVATION:.0e}")
    return out


def scaler_skips(history: History) -> str | None:
    """The summary's count of the steps a GradScaler skipped (the loss scale's overflow), or None where none was."""
    steps = [r for r in history.steps if r.micro_batches]
    skipped = [r.step for r in steps if r.scaler_skipped]
    if not skipped:
        return None
    runs: list[list[int]] = []
    for step in skipped:
        if runs and step == runs[-1][-1] + 1:
            runs[-1].append(step)
        else:
            runs.append([step])
    where = ", ".join(_steps(run) for run in runs)
    return (f"{len(skipped)} of {len(steps)} step(s) skipped by the GradScaler (steps {where}): the loss scale's "
            "overflow")
