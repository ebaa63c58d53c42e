"""A watched model copies and saves as the script's own: `copy.deepcopy` (an EMA, AveragedModel) and
`torch.save(model)` work through every entry point, the copy carries no debug-nan hook (a no-op of the standard
library stands in: loading needs no debug-nan) and the copy is not watched."""

import copy
import io
import pickle
import pickletools

import torch

import debug_nan
from tests.support.run.script_runs import alone, watched, write

# the shape of a word-language-model example: the whole model saved every epoch, reloaded for the test pass; an
# EMA kept by deep copy and AveragedModel; a NaN planted in the last epoch's data with --bug
EPOCHS = """
    import argparse, copy, io, sys
    import torch
    from torch import nn

    parser = argparse.ArgumentParser()
    parser.add_argument("--bug", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)

    class Tagger(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(10, 6)
            self.rnn = nn.LSTM(6, 8, batch_first=True)
            self.head = nn.Linear(8, 10)

        def forward(self, tokens):
            out, _ = self.rnn(self.embed(tokens))
            return self.head(out)

    model = Tagger()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    average = torch.optim.swa_utils.AveragedModel(model)
    shadow = copy.deepcopy(model)
    tokens = torch.randint(0, 10, (4, 5))
    for epoch in range(3):
        for batch in range(2):
            logits = model(tokens)
            if args.bug and epoch == 2:
                logits = logits * float("inf")
            loss = nn.functional.cross_entropy(logits.reshape(-1, 10), tokens.reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            average.update_parameters(model)
            with torch.no_grad():
                for s, p in zip(shadow.parameters(), model.parameters()):
                    s.mul_(0.9).add_(p, alpha=0.1)
        saved = io.BytesIO()
        torch.save(model, saved)
        with torch.serialization.safe_globals([Tagger, nn.Embedding, nn.LSTM, nn.Linear]):
            best = torch.load(io.BytesIO(saved.getvalue()))  # torch's default weights_only=True
        with torch.no_grad():
            test = nn.functional.cross_entropy(best(tokens).reshape(-1, 10), tokens.reshape(-1))
            ema = nn.functional.cross_entropy(average(tokens).reshape(-1, 10), tokens.reshape(-1))
        print(f"epoch {epoch} loss {loss.item():.6f} reloaded {test.item():.6f} averaged {ema.item():.6f} "
              f"saved {len(saved.getvalue()) > 0}")
"""


def test_whole_model_saved_every_epoch_and_an_ema_by_deepcopy_run_as_alone(tmp_path):
    script = write(tmp_path, EPOCHS)
    plain = alone(script)
    done, report = watched(script)
    assert plain.returncode == 0 and done.returncode == 0, done.stderr
    assert done.stdout == plain.stdout and plain.stdout.count("\n") == 3
    assert (report["status"], report["steps_run"]) == ("clean", 6)
    assert "cannot pickle" not in done.stderr and "Traceback" not in done.stderr


def test_a_broken_run_that_saves_and_averages_still_gives_its_finding(tmp_path):
    script = write(tmp_path, EPOCHS)
    done, report = watched(script, "--bug")
    assert done.returncode == 1, done.stderr
    first = report["first_nonfinite"]
    assert (first["step"], first["micro_step"], first["phase"]) == (5, 1, "loss")
    assert done.stdout == alone(script).stdout.split("epoch 2")[0]  # the first two epochs, then the stop


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


def test_a_task_that_copies_its_model_runs_clean(run_cli, tmp_path):
    task = write(tmp_path, """
        import copy, io
        from types import SimpleNamespace
        import torch

        def task():
            torch.manual_seed(0)
            model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))
            saved = []

            def loss(model, batch):
                saved.append(copy.deepcopy(model))  # an EMA's copy, a checkpoint every step
                torch.save(model, io.BytesIO())
                return model(batch).pow(2).mean()

            return SimpleNamespace(model=model, batches=[torch.ones(2, 3)] * 3, loss=loss,
                                   optimizer=lambda params: torch.optim.SGD(params, lr=0.1))
    """, "copy_task.py")
    done = run_cli("--task", f"{task}:task", "--device", "cpu", "--max-steps", "3", "--no-bundle")
    assert done.code == 0, done.output
    assert (done.report["status"], done.report["steps_run"]) == ("clean", 3)


def test_a_failure_of_debug_nan_itself_is_not_blamed_on_the_script(run_here, tmp_path, monkeypatch):
    from debug_nan.app import run_job as job

    # a planted bug of debug-nan's own: the hooks call a listener method of the wrong arity
    monkeypatch.setattr(job.RunListener, "micro_begin", job.RunListener.backward_end)
    script = write(tmp_path, EPOCHS)
    done, _, stderr = run_here("python", str(script))
    said = " ".join(stderr.split())
    assert "debug-nan itself failed inside the command (TypeError: RunListener.backward_end() takes 3 " \
           "positional arguments but 4 were given, at debug_nan/drivers/run/hooks.py:" in said, stderr
    assert "so this is an error in the script" not in said and done.code != 0
    assert done.report["error"].startswith("debug-nan failed: TypeError: RunListener.backward_end() takes")
