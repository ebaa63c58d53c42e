"""An optimizer wrapper (Accelerate's, Lightning's) is seen through: the script's step line, its scheduler."""

import inspect

import torch

from debug_nan.drivers.wrappers import bare, inner, step_location, unwrapped, wraps


class Wrapper:
    """Like Accelerate's AcceleratedOptimizer: param_groups of its own, a step that steps the optimizer."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    def step(self):
        self.optimizer.step()


class Loop:
    """A script's own class that holds its optimizer: its step line is the script's."""

    def __init__(self, optimizer):
        self.optimizer = optimizer

    def step(self):
        self.optimizer.step()  # the line to show


def _stepped(call, optimizer) -> tuple[str, int]:
    seen = []
    def hook(opt, args, kwargs):  # (a frame of the test's: step_location starts past it, at torch's caller)
        seen.append(step_location(opt, 2))

    handle = optimizer.register_step_pre_hook(hook)
    try:
        call()
    finally:
        handle.remove()
    return seen[0]


def test_the_scripts_line_is_found_through_a_wrapper_and_not_through_its_own_class():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    wrapped = Wrapper(optimizer)
    line = inspect.currentframe().f_lineno + 1
    where = _stepped(lambda: wrapped.step(), optimizer)
    assert where == (__file__, line)
    source, start = inspect.getsourcelines(Loop.step)
    mine = start + next(i for i, text in enumerate(source) if "the line to show" in text)
    assert _stepped(Loop(optimizer).step, optimizer) == (__file__, mine)


def test_a_scheduler_built_on_a_wrapper_belongs_to_the_optimizer():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    assert wraps(Wrapper(Wrapper(optimizer)), optimizer) and wraps(optimizer, optimizer)
    assert not wraps(Wrapper(torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)), optimizer)


def test_the_users_module_is_found_inside_ddp_dataparallel_and_compile():
    model = torch.nn.Linear(2, 1)
    assert unwrapped(torch.compile(model)) == (model, True)
    assert unwrapped(torch.nn.DataParallel(torch.compile(model))) == (model, True)
    assert unwrapped(torch.nn.DataParallel(model)) == (model, False)
    assert bare(model) is model and bare(torch.compile(torch.nn.DataParallel(model))) is model


def test_the_torch_optimizer_and_scheduler_are_found_inside_their_wrappers():
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=0.1)
    assert inner(Wrapper(Wrapper(optimizer))) is optimizer and inner(optimizer) is optimizer
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, 1)
    held = type("AcceleratedScheduler", (), {"scheduler": scheduler})()
    assert inner(held, "scheduler") is scheduler and inner(None, "scheduler") is None
