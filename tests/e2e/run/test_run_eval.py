"""Every forward of the watched model is watched, outside training too (`debug-nan run`): a validation pass under
no_grad or inference_mode, a generate loop. A NaN (or +Inf) in such a forward's output is a finding of phase
`eval` at the last optimizer step before it, its op and line named by an in-place replay of that forward; a -Inf
mask in an output stays silent; a healthy script with a validation pass runs unchanged."""

from tests.support.run.script_runs import write
from tests.support.run.side_by_side import plain

ATTENTION = """\
import torch
import torch.nn.functional as F

torch.manual_seed(0)


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(10, 8)
        self.query, self.key = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
        self.head = torch.nn.Linear(8, 2)

    def forward(self, tokens, keep):
        h = self.embed(tokens)
        scores = self.query(h) @ self.key(h).transpose(1, 2) / 8 ** 0.5
        scores = scores.masked_fill(~keep[:, None, :], float("-inf"))
        return self.head((scores.softmax(-1) @ h).mean(1))


model = Attention()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
full = torch.ones(4, 6, dtype=torch.bool)
train = [(torch.randint(0, 10, (4, 6)), full, torch.randint(0, 2, (4,))) for _ in range(3)]
held_out_keep = full.clone()
held_out_keep[2] = {hidden}  # True: a healthy pass; False: sample 2 of the held-out batch hides every key
held_out = [(torch.randint(0, 10, (4, 6)), held_out_keep, torch.randint(0, 2, (4,)))] * 2
for epoch in range(2):
    model.train()
    for tokens, keep, labels in train:
        loss = F.cross_entropy(model(tokens, keep), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.eval()
    with {mode}():
        val = sum(F.cross_entropy(model(t, k), y).item() for t, k, y in held_out) / len(held_out)
    print(f"epoch {{epoch}} train {{loss.item():.4f}} val {{val:.4f}}")
"""

MASKED_LOGITS = """\
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Linear(6, 5)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
allowed = torch.tensor([True, True, True, False, False])


class Masked(torch.nn.Module):  # the output itself holds -inf where a class is not allowed (a deliberate mask)
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x).masked_fill(~allowed, float("-inf"))


masked = Masked(model)
for step in range(4):
    x, y = torch.randn(8, 6), torch.randint(0, 3, (8,))
    loss = F.cross_entropy(masked(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with torch.inference_mode():
        print(f"step {step} val {F.cross_entropy(masked(torch.randn(8, 6)), y).item():.4f}")
"""

GENERATE = """\
import torch

torch.manual_seed(0)
PAD = 0


class TinyLM(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(12, 16)
        self.mix = torch.nn.Linear(16, 16)
        self.head = torch.nn.Linear(16, 12)

    def forward(self, tokens):
        h = self.embed(tokens)
        scores = self.mix(h) @ h.transpose(1, 2)
        scores = scores.masked_fill((tokens == PAD)[:, None, :], float("-inf"))  # padding is never attended
        return self.head(scores.softmax(-1) @ h)


model = TinyLM()
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
for step in range(3):
    tokens = torch.randint(1, 12, (4, 8))
    logits = model(tokens[:, :-1])
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 12), tokens[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")

model.eval()
prompt = torch.full((1, 3), PAD)  # an empty prompt, all padding: no key to attend to
with torch.no_grad():
    for _ in range(4):
        probs = model(prompt)[:, -1].softmax(-1)
        prompt = torch.cat([prompt, torch.multinomial(probs, 1)], 1)
print(prompt.tolist())
"""


def test_a_nan_only_in_validation_is_found_with_its_op(tmp_path, run_here):
    write(tmp_path, ATTENTION.format(hidden="False", mode="torch.no_grad"))
    done, stdout, stderr = run_here("python", "script.py")
    assert done.code == 1, stderr
    f = done.report["findings"][0]
    assert (f["phase"], f["step"], f["micro_step"], f["op"], f["kind"]) == (
        "eval", 3, 1, "aten._softmax.default", "nan")
    assert (f["cause"], f["source"], f["module_type"]) == ("all_masked_softmax", "script.py:18", "Attention")
    assert "Those rows belong to samples #2" in f["explanation"]
    assert f["explanation"].startswith("In a forward of the model outside training after step 3 (eval mode, "
                                       "no_grad")
    said = " ".join(stderr.split())
    assert "where after step 3, eval batch 1, phase eval" in said
    assert "every training step before it was finite. The run was stopped at that forward" in said
    assert stdout == ""  # stopped in the first validation forward, before the epoch's line


def test_a_healthy_validation_pass_runs_as_it_does_alone(tmp_path, run_here):
    """Both held-out forwards and every training step are checked; the output is the script's, byte for byte."""
    write(tmp_path, ATTENTION.format(hidden="True", mode="torch.inference_mode"))
    alone = plain("script.py", cwd=tmp_path)
    done, stdout, _ = run_here("python", "script.py")
    assert (done.code, alone.returncode) == (0, 0) and stdout == alone.stdout
    assert stdout.count("val ") == 2 and "nan" not in stdout
    assert (done.report["status"], done.report["steps_run"]) == ("clean", 6)


def test_an_output_masked_with_minus_inf_stays_silent(tmp_path, run_here):
    write(tmp_path, MASKED_LOGITS)
    alone = plain("script.py", cwd=tmp_path)
    done, stdout, _ = run_here("python", "script.py")
    assert (done.code, done.report["status"], done.report["steps_run"]) == (0, "clean", 4)
    assert stdout == alone.stdout and stdout.count("val ") == 4


def test_a_generate_loop_is_stopped_at_its_nan_before_the_sampling_raises(tmp_path, run_here):
    """Alone, the script dies in torch.multinomial on NaN probabilities; watched, the forward that made them is the
    finding, replayed in inference mode at the softmax of the all-padding prompt."""
    write(tmp_path, GENERATE)
    alone = plain("script.py", cwd=tmp_path)
    assert alone.returncode == 1 and "multinomial" in alone.stderr
    done, stdout, stderr = run_here("python", "script.py")
    assert done.code == 1 and stdout == alone.stdout  # the three training steps' lines
    f = done.report["findings"][0]
    assert (f["phase"], f["step"], f["micro_step"], f["op"], f["source"]) == \
        ("eval", 3, 1, "aten._softmax.default", "script.py:18")
    assert "multinomial" not in stderr


# an update that breaks the weights, then the validation pass: the validation's inf output is not the origin
UPDATE_THEN_VALIDATION = """\
import sys
import torch
import torch.nn.functional as F

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
g = torch.Generator().manual_seed(1)
for step in range(1, 7):
    x, y = torch.randn(32, 8, generator=g), torch.randint(0, 4, (32,), generator=g)
    loss = F.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.param_groups[0]["lr"] = float("inf") if step == 4 else 0.1
    optimizer.step()
    model.eval()
    with torch.no_grad():
        val = F.cross_entropy(model(torch.randn(64, 8, generator=g)), torch.zeros(64, dtype=torch.long))
    model.train()
    print(f"step {step} loss {loss.item():.4f} val {val.item():.4f}")
"""


def test_an_update_that_broke_the_weights_is_named_before_the_validation_that_reads_them(tmp_path, run_here):
    """The update's parameter check is read at the validation's first forward (as the CLI reads it before its eval
    pass), so the finding is the optimizer step at the script's line, not `eval` at a line inside torch."""
    write(tmp_path, UPDATE_THEN_VALIDATION, "train.py")
    done = run_here("python", "train.py")[0]
    f = done.first
    assert done.code == 1 and (f["step"], f["phase"], f["cause"], f["source"]) == (
        4, "optimizer", "nonfinite_parameter", "train.py:15"), done.output
    assert "The learning rate is inf in optimizer.param_groups[0]" in f["explanation"]
    assert "aten.add_.Tensor was called with alpha=-inf: the step size is not finite." in f["explanation"]
    assert "a mask value" not in f["explanation"]
