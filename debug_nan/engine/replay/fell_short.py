"""When the replay does not name the op: it could not run (the driver cannot replay the micro-batch exactly, or the
replay ran out of memory: the watch's finding stands, with the reason), or it stayed finite where the run did not.

Reproducible or not: a replay that stayed finite is replayed once more. A second replay that names an origin means
the first missed it: the kernels are not deterministic on this input, and its finding stands. Two finite replays
that agree bit for bit (the loss and every gradient) mean the value is not reproducible from the model's state and
the batch: the cause is outside them (script state the replay did not see, a kernel that computed otherwise in the
run, the device itself), and the finding says so plainly, with where it ran (rank, host, device) and `reproducible:
false`, as a rerun machine tells a transient fault from a reproducible one.
"""

from __future__ import annotations

import torch

from debug_nan.engine.explain.evidence import STAYED_FINITE, machine, watch_only_finding
from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.replay.driver import NotReplayable, StepInputs, TaskFailure
from debug_nan.engine.trace.events import bitwise_equal
from debug_nan.engine.watch.watch import Check
from debug_nan.errors import describe_exception


def not_replayable_finding(driver, inputs: StepInputs, micro: int, check: Check | None,
                           error: BaseException | None, why: NotReplayable) -> Finding:
    """The driver could not replay the micro-batch exactly: the watch's finding stands, with the reason."""
    what = f"the micro-batch could not be replayed in place: {why}."
    return _watch_finding(driver, inputs, micro, check, error, what, f"{what} So the op is not named.")


def out_of_memory_finding(driver, inputs: StepInputs, micro: int, check: Check | None, error: BaseException | None,
                          exc: BaseException) -> Finding:
    """The replay (which keeps more alive than the run: the tracer's evidence, anomaly mode's tracebacks) ran out
    of memory: the watch's finding stands, without the op."""
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    what = f"the op-level replay ran out of memory ({describe_exception(exc)}), so the op is not named."
    return _watch_finding(driver, inputs, micro, check, error, what,
                          f"{what} To name it, replay the repro bundle on a machine with more memory "
                          f"(debug-nan replay BUNDLE --device ...), or lower the batch size.")


def _watch_finding(driver, inputs: StepInputs, micro: int, check: Check | None, error: BaseException | None,
                   what: str, why: str) -> Finding:
    """The replay stopped short (`what`): the state goes back to the step's start and the watch's finding stands
    (`why` in its explanation); an exception with no check behind it stays the script's failure."""
    inputs.snapshot.restore()  # (drops the replay's gradients and activations before going on)
    driver.log(f"  [pinpoint] {what[0].upper()}{what[1:]}", "yellow")
    if check is None:
        raise TaskFailure(f"step {inputs.step}, micro-batch {micro}: {describe_exception(error)}; {what} "
                          f"Whether a NaN/Inf came before the exception is unknown.")
    return watch_only_finding(inputs.step, micro, inputs.batches[micro - 1], check, driver.model, why=why)


def replay_again(pinpointer, inputs: StepInputs, micro: int) -> tuple[object, object, bool | None]:
    """Replay micro-batch `micro` once more after a replay that stayed finite (its values in
    `pinpointer.finite_values`) -> (tracer, origin or None, whether the two replays agree bit for bit; None when
    this one found an origin or raised)."""
    first, pinpointer.finite_values = pinpointer.finite_values, []
    pinpointer.driver.log(f"  [pinpoint] the replay stayed finite where the run did not: replaying step "
                          f"{inputs.step} micro-batch {micro} once more, from the same state and batch...")
    tracer, event, exc, _ = pinpointer.replay(inputs, micro)
    if event is not None or exc is not None:
        return tracer, event, None
    second, pinpointer.finite_values = pinpointer.finite_values, []
    same = len(first) == len(second) and all(bitwise_equal(a, b) for a, b in zip(first, second))
    return tracer, None, same


def transient_finding(driver, step: int, micro: int, raw, check: Check, same: bool) -> Finding:
    """The watch's finding of a value two finite replays did not reproduce, told as such."""
    where = machine(driver)
    if same:
        why = (f"{STAYED_FINITE} where the run did not, in two replays from the run's own state and batch that "
               f"agree bit for bit (the loss and every gradient): the NaN/Inf is not reproducible from the model's "
               f"state and the batch. Its cause is outside them: script state the replay did not see (a global, a "
               f"random draw outside torch's generators, saved-tensor hooks or code outside torch's function hooks "
               f"under `debug-nan run`), a kernel that computed otherwise in the run, or the device itself, a "
               f"transient fault ({where}).")
    else:
        why = (f"{STAYED_FINITE} where the run did not, and two replays from the run's own state and batch computed "
               f"different values: the kernels are not deterministic on this input ({where}), so the NaN/Inf is "
               f"not reproducible from the model's state and the batch.")
    finding = watch_only_finding(step, micro, raw, check, driver.model, why)
    finding.reproducible = False
    finding.suggestions.insert(0, f"Replay the repro bundle on another device or host (`debug-nan replay BUNDLE "
                                  f"--device ...`, the repro line above): a finding there names the op and this "
                                  f"device computed otherwise; a clean replay there too points at the script's own "
                                  f"state. (Follows from the two replays, which "
                                  f"{'agree bit for bit' if same else 'differ'}.)")
    return finding
