"""The tape in mixed precision (drivers/run/tape.py): each entry keeps the autocast state it ran under and the
replay re-enters it, whatever is in force around the replay; a replayed dtype that is not the run's is said; the
fp16 probe's backward takes the loss before the GradScaler's scale."""

import re

import pytest
import torch
from torch import nn

from debug_nan.drivers.run.tape import MODEL, Tape
from tests.support.precision import CPU_FP16, NO_CPU_FP16
from tests.unit.drivers.run.test_tape import forward

pytestmark = pytest.mark.skipif(not CPU_FP16, reason=NO_CPU_FP16)
FP16 = ("cpu", torch.float16, True)


def _record(recorder, model, x, y):
    """The model and its loss under fp16 autocast, the loss's last step in a nested float32 region."""
    tape = recorder.tape = Tape(first_form="single")
    with torch.autocast("cpu", dtype=torch.float16):
        out = forward(recorder, tape, model, x)
        diff = out - y
        with torch.autocast("cpu", enabled=False):
            loss = diff.float().pow(2).mean()
    recorder.tape = None
    tape.close((loss,), {})
    return tape, out, loss


def test_each_entry_keeps_the_autocast_state_it_ran_under(recorder):
    torch.manual_seed(0)
    model, x, y = nn.Linear(4, 2), torch.randn(3, 4), torch.randn(3, 2)
    tape, out, _ = _record(recorder, model, x, y)
    states = {getattr(e.func, "__name__", e.func): e.autocast for e in tape.entries}
    assert states["model"] == (FP16,) and states["sub"] == (FP16,)
    assert states["pow"] == () and states["mean"] == ()  # the nested autocast(enabled=False) region
    assert tape.entries[0].func is MODEL and tape.entries[0].dtypes == [torch.float16]
    assert tape.backward_autocast == ()


@pytest.mark.parametrize("around", ["none", "fp16", "bf16"])
def test_the_replay_runs_in_the_runs_precision_whatever_is_in_force_around_it(recorder, around):
    """A replay from inside the script's own autocast region (an eval forward's hook) or outside the one the call
    ran in computes the run's values bit for bit, in the run's dtypes."""
    torch.manual_seed(0)
    model, x, y = nn.Linear(4, 2), torch.randn(3, 4), torch.randn(3, 2)
    tape, out, loss = _record(recorder, model, x, y)
    region = torch.autocast("cpu", dtype=torch.float16 if around == "fp16" else torch.bfloat16,
                            enabled=around != "none")
    with region:
        values = tape.replay(model, (x.clone(),), {})
    (replayed,), _ = tape.backward_args(values)
    assert values[tape.entries[0].outputs[0]].dtype == torch.float16
    assert torch.equal(values[tape.entries[0].outputs[0]], out) and torch.equal(replayed, loss)
    assert tape.diverged is None


def test_a_replayed_dtype_that_is_not_the_runs_is_the_replays_divergence(recorder):
    torch.manual_seed(0)
    model, x, y = nn.Linear(4, 2), torch.randn(3, 4), torch.randn(3, 2)
    tape, _, _ = _record(recorder, model, x, y)
    for entry in tape.entries:
        entry.autocast = ()  # as if the state had not been recorded: the replay runs in float32
    tape.replay(model, (x.clone(),), {})
    assert re.match(r"The replay diverged from the run in precision: the model's forward at test_tape\.py:\d+ gave "
                    r"its output in float32 where the run's was float16", tape.diverged)


def test_the_probe_backpropagates_the_loss_before_the_grad_scalers_scale(recorder):
    torch.manual_seed(0)
    model, x = nn.Linear(4, 1), torch.randn(3, 4)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    tape = recorder.tape = Tape(first_form="single")
    loss = forward(recorder, tape, model, x).pow(2).mean()
    scaled = scaler.scale(loss)
    tape.loss_scaled(scaled, loss)
    recorder.tape = None
    tape.close((scaled,), {})
    values = tape.replay(model, (x.clone(),), {})
    (as_run,), _ = tape.backward_args(values)
    (unscaled,), _ = tape.backward_args(values, scaled=False)
    assert torch.equal(as_run, scaled) and torch.equal(unscaled, loss)


def test_the_replayer_keeps_and_logs_the_first_divergence(recorder):
    """TapeReplayer (what `run` and `debug-nan replay` share): the divergence is logged once and kept for the
    finding (RunDriver adds it to the finding's explanation)."""
    from debug_nan.drivers.run.replayer import TapeReplayer

    torch.manual_seed(0)
    model, x, y = nn.Linear(4, 2), torch.randn(3, 4), torch.randn(3, 2)
    tape, _, _ = _record(recorder, model, x, y)
    tape.entries[0].autocast = ()  # the model's call replayed in float32
    replayer, lines = TapeReplayer(), []
    replayer.model, replayer.optimizer = model, None
    replayer.log = lambda line, colour=None: lines.append(line)
    loss, _ = replayer.replay_loss(x.clone(), tape)
    replayer.replay_loss(x.clone(), tape)
    assert replayer.diverged.startswith("The replay diverged from the run in precision: the model's forward")
    assert len(lines) == 1 and lines[0] == f"  [pinpoint] {replayer.diverged}"
    replayer.backward(loss)
    assert model.weight.grad is not None
