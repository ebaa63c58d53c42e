"""The tape of the script's code around the model (drivers/run/tape.py): what is recorded, and a replay that computes
the run's values again bit for bit, or says why it cannot."""

import pytest
import torch
from torch import nn

from debug_nan.drivers.run.recorder import Recorder
from debug_nan.drivers.run.tape import MODEL, Tape, call_arguments
from debug_nan.engine.replay.driver import NotReplayable


def forward(recorder: Recorder, tape: Tape, model: nn.Module, x: torch.Tensor, first: bool = True):
    """What drivers/run/hooks.py does around a model call: its tensors bound, the recorder off inside it."""
    if first:
        tape.first_inputs((x,), {})
    entry = tape.model_call((), {}) if first else tape.model_call((x,), {})
    recorder.suspend()
    out = model(x)
    recorder.resume()
    tape.returned(entry, out)
    return out


def test_the_loss_code_is_recorded_and_replayed_bit_for_bit(recorder):
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    x, y = torch.randn(5, 4), torch.tensor([0, 2, 1, 1, 0])
    tape = recorder.tape = Tape(first_form="single")
    logits = forward(recorder, tape, model, x)
    loss = nn.functional.cross_entropy(logits * 2.0, y) / 4
    recorder.tape = None
    tape.close((loss,), {})
    assert [getattr(e.func, "__name__", e.func) for e in tape.entries] == ["model", "mul", "cross_entropy", "div"]
    y[0] = 2  # the script reuses its target buffer: the small tensor was cloned when first used
    args, kwargs = call_arguments(x.clone(), tape.first_form)
    values = tape.replay(model, args, kwargs)
    (replayed,), _ = tape.backward_args(values)
    assert torch.equal(replayed[0] if isinstance(replayed, tuple) else replayed, loss)
    assert tape.entries[2].location is not None and tape.entries[2].location[0].endswith("test_tape.py")


def test_a_second_forward_and_a_grad_with_respect_to_the_input_are_replayed(recorder):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 3), nn.Tanh())
    x = torch.randn(2, 3, requires_grad=True)
    tape = recorder.tape = Tape(first_form="single")
    a = forward(recorder, tape, model, x)
    b = forward(recorder, tape, model, x * 2, first=False)
    (g,) = torch.autograd.grad(a.sum(), x, create_graph=True)
    loss = (a - b).pow(2).mean() + g.pow(2).sum()
    recorder.tape = None
    tape.close((loss,), {})
    values = tape.replay(model, (x.detach().clone(),), {})
    (replayed,), _ = tape.backward_args(values)
    assert torch.equal(replayed, loss) and replayed.requires_grad


def test_an_outside_tensor_changed_in_place_since_is_not_replayable(recorder):
    model = nn.Linear(4, 1)
    big = torch.ones(70_000)  # past the clone limit: kept with its version counter
    tape = recorder.tape = Tape(first_form="single")
    out = forward(recorder, tape, model, torch.ones(2, 4))
    loss = out.sum() + big[:2].sum()
    recorder.tape = None
    tape.close((loss,), {})
    big.add_(1)
    with pytest.raises(NotReplayable, match=r"changed a \(70000,\) tensor in place after using it"):
        tape.replay(model, (torch.ones(2, 4),), {})


def test_a_tensor_with_a_graph_from_outside_the_tape_makes_it_unreplayable(recorder):
    model = nn.Linear(4, 4)
    stash = model(torch.ones(1, 4))  # e.g. an activation a hook kept: its graph was made outside the tape
    tape = recorder.tape = Tape(first_form="single")
    out = forward(recorder, tape, model, torch.ones(2, 4))
    loss = (out + stash).sum()
    recorder.tape = None
    tape.close((loss,), {})
    assert "computed by AddmmBackward0 outside the recorded calls" in tape.unreplayable
    with pytest.raises(NotReplayable):
        tape.replay(model, (torch.ones(2, 4),), {})


def test_nothing_is_recorded_without_a_tape_or_inside_the_model(recorder):
    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    x = (torch.ones(1, 2) * 2)  # no tape open: passed through
    tape = recorder.tape = Tape(first_form="single")
    out = forward(recorder, tape, model, x)
    assert out.shape == (1, 1) and out.dim() == 2  # a shape is no tensor: not recorded
    recorder.tape = None
    assert [e.func for e in tape.entries] == [MODEL]


class Router(nn.Module):
    """A mixture of experts' router, keeping its auxiliary loss on itself as it leaves its forward (as Switch
    Transformer code does), and a list of what it routed."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Linear(4, 3)
        self.aux_loss, self.routed = None, []

    def forward(self, x):
        probs = self.gate(x).softmax(-1)
        self.aux_loss = (probs.mean(0) ** 2).sum() * 3
        self.routed = [probs]
        return x + probs.sum(-1, keepdim=True)


def test_a_tensor_a_module_keeps_on_itself_is_read_there_again(recorder):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), Router())
    x = torch.randn(5, 4)
    tape = recorder.tape = Tape(first_form="single", owner=model)
    out = forward(recorder, tape, model, x)
    loss = out.pow(2).mean() + 0.01 * model[1].aux_loss + model[1].routed[0].max()
    recorder.tape = None
    tape.close((loss,), {})
    assert tape.unreplayable is None
    assert [leaf for e in tape.entries for leaf in e.leaves if leaf[0] == "a"] == [
        ("a", ("1", "aux_loss", None)), ("a", ("1", "routed", 0))]
    values = tape.replay(model, (x.clone(),), {})
    (replayed,), _ = tape.backward_args(values)
    assert torch.equal(replayed, loss)
    assert replayed.grad_fn is not loss.grad_fn  # made again by the replayed forward, not the run's


def test_a_hooks_stash_in_a_dict_of_the_scripts_is_read_there_again(recorder):
    """The common feature-loss pattern: a forward hook made by a closure stores a layer's output in a dict the
    loss code reads; the replayed forward runs the hook again, so the dict holds the replayed activation."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))
    features = {}

    def keep(name):
        def hook(module, args, output):
            features[name] = output
        return hook

    model[1].register_forward_hook(keep("hidden"))
    x = torch.randn(3, 4)
    tape = recorder.tape = Tape(first_form="single", owner=model)
    out = forward(recorder, tape, model, x)
    loss = out.pow(2).mean() + features["hidden"].abs().mean()
    recorder.tape = None
    tape.close((loss,), {})
    assert tape.unreplayable is None
    assert [leaf[1][1] for e in tape.entries for leaf in e.leaves if leaf[0] == "k"] == ["hidden"]
    stale = features["hidden"]
    values = tape.replay(model, (x.clone(),), {})
    (replayed,), _ = tape.backward_args(values)
    assert torch.equal(replayed, loss) and features["hidden"] is not stale


class Steps(nn.Module):
    """A LightningModule's shape: no forward of its own, a training_step."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 1)

    def training_step(self, x):
        return self.lin(x).sum()


class Wrapper(nn.Module):
    """A strategy's wrapper (DDP's, FSDP1's): its forward calls the module it wraps."""

    def __init__(self, inner, attribute: str = "module"):
        super().__init__()
        setattr(self, attribute, inner)
        self.attribute = attribute

    def forward(self, x):
        return getattr(self, self.attribute)(x)


def redirect(wrapper: nn.Module, inner: nn.Module, method: str, x):
    """What Lightning's strategies do for a training step: the inner forward made `method` for one wrapper call."""
    original = inner.forward

    def redirected(*args):
        inner.forward = original
        return getattr(inner, method)(*args)

    inner.forward = redirected
    return wrapper(x)


def test_a_forward_a_strategy_redirected_is_redirected_again_at_the_replay():
    from debug_nan.drivers.run.model_calls import forward_as, redirected_forward

    steps = Steps()
    for wrapper, path in ((steps, ""), (Wrapper(steps, "_fsdp_wrapped_module"), "_fsdp_wrapped_module")):
        seen = []
        hook = wrapper.register_forward_pre_hook(lambda m, args: seen.append(redirected_forward(m)))
        x = torch.ones(1, 2)
        assert redirect(wrapper, steps, "training_step", x).item() == steps.training_step(x).item()
        hook.remove()
        assert seen == [(path, "training_step")] and redirected_forward(wrapper) is None
        with pytest.raises(NotImplementedError):
            wrapper(x)
        with forward_as(wrapper, seen[0]):
            assert wrapper(x).item() == steps.training_step(x).item()
        assert "forward" in vars(steps) and steps.forward == steps.__class__.forward.__get__(steps)


def test_a_tape_that_ends_inside_no_grad_leaves_the_grad_mode_as_its_replay_found_it(recorder):
    """A loop's own update ends at its validation's first forward, inside `with torch.no_grad()`: the tape holds
    the block's entry, not its exit. Replaying it must not leave the next replay's forward without gradients."""
    model = nn.Linear(2, 1)
    tape = recorder.tape = Tape(first_form="single")
    forward(recorder, tape, model, torch.ones(3, 2))
    block = torch.no_grad()
    block.__enter__()  # the validation begins; the tape is cut here
    recorder.tape = None
    block.__exit__(None, None, None)
    if not any("grad" in str(getattr(e.func, "__name__", e.func)) for e in tape.entries):
        pytest.skip("this torch does not send the grad mode's switch through torch function modes")
    args, kwargs = call_arguments(torch.ones(3, 2), tape.first_form)
    tape.replay(model, args, kwargs)
    assert torch.is_grad_enabled()
