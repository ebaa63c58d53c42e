"""Through the Monitor, a watched model copies and saves as the user's own: `copy.deepcopy` and `torch.save(model)`
work, the copy carries no debug-nan hook (loading needs no debug-nan) and the copy is not watched. (Through
`debug-nan run` and --task: tests/e2e/run/test_run_copies.py.)"""

import copy
import io
import pickle
import pickletools

import torch

import debug_nan


def _globals(data: bytes) -> set[str]:
    """The modules a pickle imports when loaded."""
    found, strings = set(), []
    for op, arg, _ in pickletools.genops(data):
        if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
            strings.append(arg)
        elif op.name == "STACK_GLOBAL":
            found.add(strings[-2])
        elif op.name == "GLOBAL":
            found.add(arg.split(" ")[0])
    return found


def _check_copies(model: torch.nn.Module, x: torch.Tensor) -> None:
    """Deep copy and whole-model save/load work; neither holds a debug-nan hook nor needs debug-nan."""
    hooked = [h for m in model.modules() for h in m._forward_hooks.values()]
    assert hooked, "the watch is attached"
    twin = copy.deepcopy(model)
    saved = io.BytesIO()
    torch.save(model, saved)
    assert not {m for m in _globals(pickle.dumps(model)) if m.startswith("debug_nan")}
    with torch.serialization.safe_globals([type(m) for m in model.modules()]):
        loaded = torch.load(io.BytesIO(saved.getvalue()))  # weights_only=True, torch's default: plain dicts only
    for other in (twin, loaded):
        assert not [h for m in other.modules() for h in m._forward_hooks.values()]  # the user's model, unhooked
        assert torch.equal(other(x), model(x))
    assert [h for m in model.modules() for h in m._forward_hooks.values()] == hooked  # the watched one untouched


def test_through_the_monitor_the_copy_is_not_watched(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    monitor = debug_nan.Monitor(model, lambda m, b: m(b).pow(2).mean(), optimizer)
    x = torch.ones(2, 3)
    with monitor.step(x):
        copy_inside = copy.deepcopy(model)
        copy_inside(x)  # its forward is not recorded by the watch
        model(x).pow(2).mean().backward()
        assert len(monitor.watch._modules) == 3  # the model's hooked modules only: 2 Linear and the root
    optimizer.step()
    _check_copies(model, x)
    monitor.close()
