"""A watched model copies and saves as the script's own: `copy.deepcopy` (an EMA, AveragedModel) and
`torch.save(model)` work through every entry point, the copy carries no debug-nan hook (a no-op of the standard
library stands in: loading needs no debug-nan) and the copy is not watched. The scripts run alone in a fresh process
(the reference) and watched in this one. (Through the Monitor: tests/unit/drivers/monitor/test_copies.py.)"""


import pytest

from tests.support.run.script_runs import alone, write

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


@pytest.fixture(scope="session")
def epochs_alone(tmp_path_factory):
    """EPOCHS run alone (`python script.py`, no --bug), once: the reference of both tests below."""
    return alone(write(tmp_path_factory.mktemp("epochs"), EPOCHS))


def test_whole_model_saved_every_epoch_and_an_ema_by_deepcopy_run_as_alone(tmp_path, run_here, epochs_alone):
    script = write(tmp_path, EPOCHS)
    done, stdout, stderr = run_here("python", script.name)
    assert epochs_alone.returncode == 0 and done.code == 0, stderr
    assert stdout == epochs_alone.stdout and epochs_alone.stdout.count("\n") == 3
    assert (done.report["status"], done.report["steps_run"]) == ("clean", 6)
    assert "cannot pickle" not in stderr and "Traceback" not in stderr


def test_a_broken_run_that_saves_and_averages_still_gives_its_finding(tmp_path, run_here, epochs_alone):
    script = write(tmp_path, EPOCHS)
    done, stdout, stderr = run_here("python", script.name, "--bug")
    assert done.code == 1, stderr
    first = done.first
    assert (first["step"], first["micro_step"], first["phase"]) == (5, 1, "loss")
    assert stdout == epochs_alone.stdout.split("epoch 2")[0]  # the first two epochs, then the stop


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
    from debug_nan.app.run_watch import Watch

    # a planted bug of debug-nan's own: the hooks call a listener method of the wrong arity
    monkeypatch.setattr(Watch, "micro_begin", Watch.backward_end)
    script = write(tmp_path, EPOCHS)
    done, _, stderr = run_here("python", str(script))
    said = " ".join(stderr.split())
    assert "debug-nan itself failed inside the command (TypeError: Watch.backward_end() takes 3 " \
           "positional arguments but 4 were given, at debug_nan/drivers/run/hooks.py:" in said, stderr
    assert "so this is an error in the script" not in said and done.code != 0
    assert done.report["error"].startswith("debug-nan failed: TypeError: Watch.backward_end() takes")
