"""The global hooks of `debug-nan run` (drivers/run/hooks.py), in this process on a tiny model: how a script's calls
become micro-batches and steps, and that uninstall() leaves torch as it was."""

import pytest
import torch

from debug_nan.drivers.run.hooks import Hooks, RunStopped


class Recorder:
    def __init__(self):
        self.events = []

    def attach(self, model, optimizer):
        self.events.append(("attach", type(model).__name__, type(optimizer).__name__))

    def micro_begin(self, batch, step, micro):
        self.events.append(("micro", step, micro, tuple(batch.shape)))

    def backward_begin(self, loss, step, micro, tape):
        self.events.append(("backward", step, micro))

    def backward_end(self, step, micro):
        pass

    def step_begin(self, step, update):
        self.events.append(("step_begin", step))

    def step_end(self, step, skipped):
        self.events.append(("step_end", step, skipped))

    def training_ends(self):
        self.events.append(("ends",))

    def follow(self, optimizer):
        self.events.append(("follow", type(optimizer).__name__))

    def forwards_given_up(self, tape, calls, outputs):
        self.events.append(("given up", tuple(calls)))

    def eval_begin(self, module, args, kwargs, steps_taken):
        self.events.append(("eval", steps_taken, tuple(args[0].shape)))

    def eval_end(self, output):
        self.events.append(("eval end", tuple(output.shape)))


@pytest.fixture
def hooks():
    recorder = Recorder()
    h = Hooks(recorder)
    originals = (torch.autograd.backward, torch.optim.Optimizer.__init__, torch.amp.GradScaler.update)
    h.install()
    yield h, recorder.events
    h.uninstall()
    assert (torch.autograd.backward, torch.optim.Optimizer.__init__, torch.amp.GradScaler.update) == originals


def test_accumulation_a_micro_batch_is_a_backward_a_step_an_optimizer_step(hooks):
    h, events = hooks
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with torch.no_grad():
        model(torch.ones(5, 3))  # an evaluation: no micro-batch, a forward outside training (before any step)
    for _ in range(2):
        for rows in (2, 3):
            model(torch.ones(rows, 3)).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    with torch.inference_mode():
        model(torch.ones(4, 3))
    assert events == [
        ("attach", "Sequential", "SGD"), ("eval", 0, (5, 3)), ("eval end", (5, 1)),
        ("micro", 1, 1, (2, 3)), ("backward", 1, 1), ("micro", 1, 2, (3, 3)), ("backward", 1, 2),
        ("step_begin", 1), ("step_end", 1, False),
        ("micro", 2, 1, (2, 3)), ("backward", 2, 1), ("micro", 2, 2, (3, 3)), ("backward", 2, 2),
        ("step_begin", 2), ("step_end", 2, False), ("eval", 2, (4, 3)), ("eval end", (4, 1))]
    assert h.state.root is model


def test_a_closure_runs_the_micro_batch_inside_the_optimizer_step(hooks):
    """Lightning's way: optimizer.step(closure), the closure does forward + backward."""
    _, events = hooks
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    def closure():
        loss = model(torch.ones(2, 3)).sum()
        loss.backward()
        return loss

    optimizer.step(closure)  # (the step's update ends when the closure returns, before the optimizer's own math)
    assert events[1:] == [("micro", 1, 1, (2, 3)), ("backward", 1, 1), ("step_begin", 1), ("step_end", 1, False)]


def test_a_grad_scaler_skipped_step_ends_at_its_update(hooks):
    _, events = hooks
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 127)  # times a gradient of 8: inf in float32
    for _ in range(2):
        scaler.scale(model(torch.full((2, 3), 4.0)).sum()).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
    assert [e for e in events if e[0] == "step_end"] == [("step_end", 1, True), ("step_end", 2, True)]


def test_two_optimizers_are_both_watched_and_back_to_back_steps_are_one(hooks):
    """A generator's and a discriminator's optimizers, created before training: both watched, with the models that
    hold their parameters; two that step with no forward between them close one step, at the next forward."""
    h, events = hooks
    g, d = torch.nn.Linear(2, 2), torch.nn.Linear(2, 1)
    og, od = torch.optim.SGD(g.parameters(), lr=0.1), torch.optim.SGD(d.parameters(), lr=0.1)
    d(g(torch.ones(2))).sum().backward()
    og.step()
    od.step()
    # (named as the script's variables, not __main__)
    assert h.failure is None and [n for n, _ in h.state.models.named_children()] == ["linear0", "linear1"]
    assert [e for e in events if e[0] == "step_end"] == []  # (another optimizer could still join the step)
    d(torch.ones(2)).sum().backward()
    od.step()
    h.flush_step()
    assert [e for e in events if e[0] in ("step_begin", "step_end")] == \
        [("step_begin", 1), ("step_end", 1, False), ("step_begin", 2), ("step_end", 2, False)]


def test_a_replacing_optimizer_is_followed_and_two_that_both_step_are_refused(hooks):
    """A second training stage (a new optimizer of the same model, the old one no longer stepping) is followed;
    an old one that steps again means two optimizers at once (a usage error, as for a GAN)."""
    h, events = hooks
    model = torch.nn.Linear(3, 1)
    first = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.ones(2, 3)).sum().backward()
    first.step()
    second = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.ones(2, 3)).sum().backward()
    second.step()
    assert ("follow", "Adam") in events and h.state.optimizer is second and events[-1] == ("step_end", 2, False)
    model(torch.ones(2, 3)).sum().backward()
    with pytest.raises(RunStopped):
        first.step()
    assert "the script steps an optimizer debug-nan run does not watch (SGD) beside the Adam" in str(h.failure)


def test_the_listener_protocol_declares_every_event_the_hooks_send_and_the_watch_takes_them_all():
    import inspect
    import re

    from debug_nan.app.run_watch import Watch
    from debug_nan.drivers.run import hooks as hooks_module
    from debug_nan.drivers.run import optimizers
    from debug_nan.drivers.run.hooks import Listener

    sent = set(re.findall(r"listener\.(\w+)\(", inspect.getsource(hooks_module) + inspect.getsource(optimizers)))
    declared = {name for name, value in vars(Listener).items() if callable(value) and not name.startswith("_")}
    assert "follow" in sent and "forwards_given_up" in sent
    assert sent == declared
    for listener in (Watch, Recorder):
        assert all(callable(getattr(listener, name, None)) for name in declared), listener


def test_the_micro_batchs_phase_is_one_named_state_and_a_backward_that_raised_leaves_it_open(hooks):
    from debug_nan.drivers.run.hook_state import Micro

    h, _ = hooks
    model = torch.nn.Linear(3, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    assert h.state.phase is Micro.CLOSED
    out = model(torch.ones(2, 3))
    assert (h.state.phase, h.state.open, h.state.step, h.state.micro) == (Micro.FORWARD, True, 1, 1)
    out.register_hook(lambda grad: seen.append(h.state.phase))
    out.sum().backward()
    assert seen == [Micro.BACKWARD] and h.state.phase is Micro.CLOSED and not h.state.open
    optimizer.step()
    assert (h.state.step, h.state.micro, h.state.stepped_this_step) == (2, 0, True)

    def fail(grad):
        raise ValueError("the script's own check")

    out = model(torch.ones(2, 3))
    out.register_hook(fail)
    with pytest.raises(ValueError):
        out.sum().backward()
    assert h.state.phase is Micro.FORWARD and h.state.micro == 1  # (the run's end replays that micro-batch)


def test_a_hand_written_update_ends_at_a_validation_forward_and_the_pass_is_not_recorded(hooks):
    """pytorch/examples' word language model updates by hand, then validates: its step ends at the validation's
    first forward (the update ran before it), and no tape stays open through the pass (it recorded every
    validation output: 24 GB on that example, killed by the OOM killer)."""
    h, events = hooks
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 2)
    for step in range(1, 3):
        model.zero_grad()
        model(torch.ones(4, 3)).sum().backward()
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-0.1)
        with torch.no_grad():
            for _ in range(2):
                out = model(torch.ones(5, 3))
                assert h.recorder.tape is None  # nothing of the validation pass is recorded
                (out * 2).sum().item()
    steps = [e for e in events if e[0] in ("step_begin", "step_end", "eval")]
    # the first step found the model by its backward (counted, not watched); the second closes at its validation
    assert steps == [("eval", 1, (5, 3)), ("eval", 1, (5, 3)), ("step_begin", 2), ("step_end", 2, False),
                     ("eval", 2, (5, 3)), ("eval", 2, (5, 3))]
