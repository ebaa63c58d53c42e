"""`debug-nan run`'s finding is right at first read: the user's own line with the library's line beside it, the
origin in the loss's lineage (a buffer nothing harmed read is a note), the first advice from the evidence (the
step, the batch, the run's own clipping), and a value the same state and batch do not reproduce said plainly."""

import re
import socket

from tests.support.run.script_runs import tripped

# an nn.LayerNorm inside nn.Sequential: the op runs in torch.nn.functional, the user's line is the model call
LAYER_NORM = """import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 4):
    x = torch.randn(4, 8) * (1e36 if step == 2 else 1.0)
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4g}")
"""


def test_the_source_is_the_scripts_line_and_torchs_line_is_beside_it(tmp_path, run_here):
    first, _, stderr = tripped(run_here, tmp_path, LAYER_NORM, "norm.py")
    assert (first["step"], first["phase"], first["op"], first["module"], first["module_type"]) == (
        2, "forward", "aten.native_layer_norm.default", "1", "LayerNorm")
    assert (first["source"], first["source_line"]) == ("norm.py:9", "loss = model(x).pow(2).mean()")
    assert first["inside"].startswith("torch/nn/functional.py:") and "layer_norm" in first["inside_line"]
    assert "  source       norm.py:9   loss = model(x).pow(2).mean()" in stderr
    assert f"  inside       {first['inside']}   {first['inside_line']}" in stderr
    # the batch held 1e36: the data comes first, and no learning rate is blamed for it
    assert first["suggestions"][0].startswith("Check the data first: the batch's tensor holds ")
    assert not any("learning rate" in s for s in first["suggestions"])


# a tiny GPT-2 of the installed transformers, built from its config (no download), whose position table came in
# ~1e36: the first block's LayerNorm overflows in step 1, before any update
GPT2 = """import torch
from transformers import GPT2Config, GPT2LMHeadModel

torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64, n_positions=16))
with torch.no_grad():
    model.transformer.wpe.weight.mul_(1e36)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
for step in range(1, 4):
    ids = torch.randint(0, 64, (2, 8))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4g}")
"""


def test_an_op_inside_an_installed_library_shows_both_lines(tmp_path, run_here):
    first, _, _ = tripped(run_here, tmp_path, GPT2, "gpt.py")
    assert (first["step"], first["op"], first["module"], first["module_type"]) == (
        1, "aten.native_layer_norm.default", "transformer.h.0.ln_1", "LayerNorm")
    assert first["source"] == "gpt.py:11"
    assert first["inside"].startswith("transformers/models/gpt2/modeling_gpt2.py:")
    assert "self.ln_1(" in first["inside_line"]
    # step 1, nothing updated yet: the weights as the run began, named with their magnitude; no learning rate
    assert first["suggestions"][0].startswith("Check the weights as the run began: parameter "
                                              "`transformer.wpe.weight` holds |w| up to ")
    assert "(Follows from the step: step 1, before any optimizer update of this run.)" in first["suggestions"][0]
    assert not any("learning rate" in s.replace("no learning rate", "") for s in first["suggestions"])


# conv -> BatchNorm -> Linear at lr 1e30: in step 2 the BatchNorm's running variance (~1e59) goes Inf, a buffer the
# training-mode loss never reads; the Linear's addmm makes the NaN that reaches the loss
BATCH_NORM = """import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 2))
optimizer = torch.optim.SGD(model.parameters(), lr=1e30)
for step in range(1, 5):
    x, y = torch.randn(8, 3, 8, 8), torch.randint(0, 2, (8,))
    loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4g}")
"""


def test_the_origin_is_in_the_losss_lineage_and_the_buffer_a_note(tmp_path, run_here):
    first, _, stderr = tripped(run_here, tmp_path, BATCH_NORM, "bn.py")
    assert (first["step"], first["phase"], first["op"], first["module"], first["module_type"], first["cause"]) == (
        2, "forward", "aten.addmm.default", "4", "Linear", "overflow")
    assert "consequence" not in first["explanation"]
    (note,) = first["notes"]
    assert note.startswith("buffer `1.running_var` went Inf in step 2 too, written by aten.native_batch_norm.default "
                           "(module `1` (BatchNorm2d), bn.py:9)")
    assert "it will harm the next eval" in note
    # the evidence is the variance's own size (about 1e58), not the finite normalised output's
    assert float(re.search(r"largest \|result\| of `running_var` is ([0-9.]+e\+[0-9]+)", note)[1]) > 1e50
    assert "  note         buffer `1.running_var` went Inf" in stderr
    # step 2, after one update at lr 1e30: the weights grew, and the script does not clip
    assert first["suggestions"][0].startswith("Lower the learning rate, or add warmup")
    assert "after 1 update(s) of this run" in first["suggestions"][0] and "Clip gradients" in first["suggestions"][0]


# weights from a checkpoint whose first layer is ~1e20: step 1 overflows before any update
LOADED = """import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
state = model.state_dict()
state["0.weight"] = state["0.weight"] * 1e20
torch.save(state, "bad.pt")
model.load_state_dict(torch.load("bad.pt"))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1, 4):
    x = torch.randn(4, 8)
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4g}")
"""


def test_an_overflow_before_any_update_blames_the_weights_not_the_learning_rate(tmp_path, run_here):
    first, _, _ = tripped(run_here, tmp_path, LOADED, "loaded.py")
    assert (first["step"], first["cause"]) == (1, "overflow")
    assert first["suggestions"][0].startswith("Check the weights as the run began: parameter `0.weight` holds |w| "
                                              "up to ")
    assert "no learning rate can be the cause" in first["suggestions"][0]
    rest = " ".join(first["suggestions"]).replace("no learning rate", "")
    assert "learning rate" not in rest and "--max-grad-norm" not in rest and "clip_grad_norm_" not in rest


# a data set with one record of 3e38 (finite, but its square overflows): the batch that holds it overflows
DATA = """import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)
features = torch.randn(64, 8)
features[21, 3] = 3e38
loader = DataLoader(TensorDataset(features, torch.randn(64, 1)), batch_size=8, shuffle=True)
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step, (x, y) in enumerate(loader, 1):
    loss = (model(x) - y).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4g}")
"""


def test_a_batch_with_an_extreme_value_puts_the_data_first(tmp_path, run_here):
    """The record is named by the DataLoader's sampler (shuffled: its row in the batch is not its index)."""
    first, _, _ = tripped(run_here, tmp_path, DATA, "data.py")
    head = first["suggestions"][0]
    assert head.startswith("Check the data first: the batch's tensor holds 3e+38 at row ")
    assert "(dataset index 21)" in head and head.endswith("(Follows from the batch's statistics.)")
    assert not any("learning rate" in s for s in first["suggestions"])


# a shuffled DataLoader over a data set whose record 21 holds a NaN; the model keeps an EMA copy of its layer that no
# optimizer holds
NAN_DATA = """import copy

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
        self.ema = copy.deepcopy(self.body).requires_grad_(False)

    def forward(self, x):
        return self.body(x)


torch.manual_seed(0)
features = torch.randn(64, 8)
features[21, 3] = float("nan")
loader = DataLoader(TensorDataset(features, torch.randn(64, 1)), batch_size=8, shuffle=True)
model = Net()
optimizer = torch.optim.SGD(model.body.parameters(), lr=0.01)
for x, y in loader:
    loss = (model(x) - y).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
"""


def test_a_non_finite_batch_names_the_dataset_index_and_an_ema_copy_is_counted_apart(tmp_path, run_here):
    first, _, stderr = tripped(run_here, tmp_path, NAN_DATA, "nan_data.py")
    assert (first["phase"], first["cause"]) == ("data", "nonfinite_input")
    assert "the batch tensor [8, 8] holds 1 NaN and 0 Inf of 64 values" in first["explanation"]
    assert "of the batch is dataset index 21 (the DataLoader's sampler)" in first["explanation"]
    assert "watching Net (161 parameters the optimizer holds, and 161 more in `ema` that no optimizer trains)" in (
        " ".join(line.strip() for line in stderr.splitlines()))


# Adam at a huge learning rate, with the script's own clipping: clipping is no advice here
CLIPS = """import torch
from torch import nn
from torch.nn.utils import clip_grad_norm_

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
optimizer = torch.optim.Adam(model.parameters(), lr=1e36)
for step in range(1, 6):
    loss = model(torch.randn(4, 8)).pow(2).mean()
    loss.backward()
    clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4g}")
"""


def test_a_run_that_clips_already_gets_no_clipping_advice(tmp_path, run_here):
    first, stdout, _ = tripped(run_here, tmp_path, CLIPS, "clips.py")
    assert (first["step"], first["cause"]) == (2, "overflow")
    head = first["suggestions"][0]
    assert head.startswith("Lower the learning rate, or add warmup")
    assert "The run clips already (torch.nn.utils.clip_grad_norm_ (max_norm 1))" in head
    assert not any("--max-grad-norm" in s or "clip_grad_norm_(model" in s or "Clip gradients" in s
                   for s in first["suggestions"])
    assert stdout.startswith("step 1 loss ")  # (the script's clipping ran as it does alone)


# a fault in one call of the run only: the forward's third call multiplies by inf, and the replay's calls of the
# same forward count on from there, so no replay meets it
TRANSIENT = """import torch
from torch import nn


class Flaky(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 1)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        y = self.fc(x)
        return y * float("inf") if self.calls == 3 else y


torch.manual_seed(0)
model = Flaky()
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(1, 5):
    loss = model(torch.randn(8, 4)).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {step} loss {loss.item():.4f}")
"""


def test_a_fault_the_same_state_and_batch_do_not_reproduce_is_said_plainly(tmp_path, run_here):
    first, _, stderr = tripped(run_here, tmp_path, TRANSIENT, "flaky.py")
    assert (first["step"], first["micro_step"], first["cause"], first["detected_by"]) == (3, 1, "unknown", "watch")
    assert first["reproducible"] is False
    assert "two replays from the run's own state and batch that agree bit for bit" in first["explanation"]
    assert "not reproducible from the model's state and the batch" in first["explanation"]
    assert f"(rank 0 on host {socket.gethostname()}, device cpu)" in first["explanation"]
    assert any(s.startswith("Replay the repro bundle on another device or host (`debug-nan replay BUNDLE --device")
               for s in first["suggestions"])
    assert "  reproducible no: two replays of the run's own state and batch stayed finite" in stderr
