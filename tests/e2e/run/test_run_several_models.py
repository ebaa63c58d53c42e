"""`debug-nan run` of scripts that train several models or optimizers: a GAN (an optimizer each), an actor and a
critic, two optimizers over one model's halves, and two encoders with a bare `nn.Parameter` (CLIP's logit scale)
under one AdamW. Every optimizer is watched with the parameters it holds; a step is an optimizer step (those that
step back to back, one step); names are the script's own (`netD.2`, `logit_scale`)."""

import pytest

from tests.support.run.script_runs import write
from tests.support.run.side_by_side import plain

GAN = """\
import torch
import torch.nn as nn

torch.manual_seed(0)
netG = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
netD = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
optG = torch.optim.Adam(netG.parameters(), lr=2e-3)
optD = torch.optim.SGD(netD.parameters(), lr={lr_d})
bce = nn.BCEWithLogitsLoss()
for it in range(5):
    real = torch.randn(32, 2) * 0.5 + 2
    fake = netG(torch.randn(32, 4))
    lossD = bce(netD(real), torch.ones(32, 1)) + bce(netD(fake.detach()), torch.zeros(32, 1))
    optD.zero_grad()
    lossD.backward()
    optD.step()
    lossG = bce(netD(fake), torch.ones(32, 1))
    optG.zero_grad()
    lossG.backward()
    optG.step()
    print(f"it {{it}} D {{lossD.item():.4f}} G {{lossG.item():.4f}}")
"""

ACTOR_CRITIC = """\
import torch
import torch.nn as nn

torch.manual_seed(0)
actor = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 3))
critic = nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 1))
actor_opt = torch.optim.Adam(actor.parameters(), lr=1e-3)
critic_opt = torch.optim.Adam(critic.parameters(), lr=1e-3)
for episode in range(4):
    states = torch.randn(16, 4)
    dist = torch.distributions.Categorical(logits=actor(states))
    actions = dist.sample()
    returns = torch.randn(16)
    values = critic(states).squeeze(-1)
    advantage = (returns - values).detach()
    actor_loss = -(dist.log_prob(actions) * advantage).mean()
    critic_loss = (returns - values).pow(2).mean()
    actor_opt.zero_grad()
    actor_loss.backward()
    actor_opt.step()
    critic_opt.zero_grad()
    critic_loss.backward()
    critic_opt.step()
    print(f"episode {episode} actor {actor_loss.item():.4f} critic {critic_loss.item():.4f}")
"""

HALVES = """\
import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(nn.Embedding(10, 8), nn.Flatten(), nn.Linear(24, 16), nn.ReLU(), nn.Linear(16, 1))
embedding_opt = torch.optim.SGD(model[0].parameters(), lr=0.1)
dense_opt = torch.optim.AdamW([p for p in model.parameters() if p.dim() and p is not model[0].weight], lr=1e-3)
for step in range(5):
    tokens, targets = torch.randint(0, 10, (8, 3)), torch.randn(8, 1)
    loss = (model(tokens) - targets).pow(2).mean()
    embedding_opt.zero_grad()
    dense_opt.zero_grad()
    loss.backward()
    if step == 2:
        embedding_opt.param_groups[0]["lr"] = {bad_lr}
    embedding_opt.step()
    dense_opt.step()
    print(f"step {{step}} loss {{loss.item():.4f}}")
"""

CLIP = """\
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
image_encoder = nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Linear(16, 8))
text_encoder = nn.Sequential(nn.Embedding(20, 16), nn.Flatten(), nn.Linear(48, 8))
logit_scale = nn.Parameter(torch.tensor(2.0))
params = [*image_encoder.parameters(), *text_encoder.parameters(), logit_scale]
optimizer = torch.optim.AdamW(params, lr=1e-2)
for step in range(5):
    images, texts = torch.randn(8, 6), torch.randint(0, 20, (8, 3))
    a = F.normalize(image_encoder(images), dim=-1)
    b = F.normalize(text_encoder(texts), dim=-1)
    logits = logit_scale.exp() * a @ b.T
    labels = torch.arange(8)
    loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        logit_scale.add_({jump} if step == 2 else 0.0)  # an unclamped scale
    print(f"step {{step}} loss {{loss.item():.4f}}")
"""

LIGHTNING_GAN = """\
import torch
import torch.nn as nn
import lightning.pytorch as pl
from torch.utils.data import DataLoader, TensorDataset

torch.manual_seed(0)


class GAN(pl.LightningModule):  # manual optimization: training_step steps both optimizers itself
    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.gen = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 2))
        self.disc = nn.Sequential(nn.Linear(2, 16), nn.LeakyReLU(0.2), nn.Linear(16, 1))
        self.bce = nn.BCEWithLogitsLoss()

    def training_step(self, batch, i):
        (real,) = batch
        opt_g, opt_d = self.optimizers()
        fake = self.gen(torch.randn(real.shape[0], 4))
        ones, zeros = torch.ones(real.shape[0], 1), torch.zeros(real.shape[0], 1)
        loss_d = self.bce(self.disc(real), ones) + self.bce(self.disc(fake.detach()), zeros)
        opt_d.zero_grad()
        self.manual_backward(loss_d)
        opt_d.step()
        loss_g = self.bce(self.disc(fake), ones)
        opt_g.zero_grad()
        self.manual_backward(loss_g)
        opt_g.step()

    def configure_optimizers(self):
        return [torch.optim.Adam(self.gen.parameters(), lr=2e-3), torch.optim.SGD(self.disc.parameters(), lr={lr_d})]


trainer = pl.Trainer(max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, accelerator="cpu")
trainer.fit(GAN(), DataLoader(TensorDataset(torch.randn(64, 2) * 0.5 + 2), batch_size=16))
print("trained", trainer.global_step)
"""


@pytest.mark.parametrize("name, source, steps", [("gan", GAN.format(lr_d="2e-3"), 10),
                                                 ("actor_critic", ACTOR_CRITIC, 8),
                                                 ("halves", HALVES.format(bad_lr="0.1"), 5),
                                                 ("clip", CLIP.format(jump="0.0"), 5),
                                                 ("lightning_gan", LIGHTNING_GAN.format(lr_d="2e-3"), 8)])
def test_healthy_scripts_of_several_models_run_as_they_do_alone(tmp_path, run_here, name, source, steps):
    write(tmp_path, source)
    alone = plain("script.py", cwd=tmp_path)
    done, stdout, stderr = run_here("python", "script.py")
    assert (done.code, alone.returncode) == (0, 0), stderr
    assert stdout == alone.stdout
    assert (done.report["status"], done.report["steps_run"]) == ("clean", steps)


def test_an_exploding_discriminator_is_found_in_the_generators_step(tmp_path, run_here):
    """optD at lr 1e25 makes the discriminator's weights huge (finite) at step 1; the generator's step (2) runs
    netD on the fakes and its last Linear overflows."""
    write(tmp_path, GAN.format(lr_d="1e25"))
    done, _, stderr = run_here("python", "script.py")
    assert done.code == 1, stderr
    f = done.report["findings"][0]
    assert (f["step"], f["micro_step"], f["phase"], f["module"], f["op"], f["cause"]) == \
        (2, 1, "forward", "netD.2", "aten.addmm.default", "overflow")
    assert "watching netG + netD (179 parameters) and their optimizers Adam `optG`, SGD `optD`" in \
        " ".join(stderr.split())


def test_an_optimizer_of_one_half_of_a_model_is_replayed_alone_in_its_step(tmp_path, run_here):
    """The embedding's SGD gets an infinite lr at step 3; the AdamW of the rest steps right after it, in the same
    step: the optimizer phase of step 3 is replayed, both optimizers in order, and the SGD step is the op."""
    write(tmp_path, HALVES.format(bad_lr='float("inf")'))
    done, _, stderr = run_here("python", "script.py")
    assert done.code == 1, stderr
    f = done.report["findings"][0]
    assert (f["step"], f["phase"], f["source"]) == (3, "optimizer", "script.py:16"), f
    assert f["op"].startswith("aten.") and f["module"] == "0"  # the embedding, named as in the model itself
    assert "The learning rate is inf in embedding_opt.param_groups[0] (embedding_opt.defaults still says 0.1)" \
        in f["explanation"]


def test_a_bare_parameter_no_module_owns_is_watched(tmp_path, run_here):
    write(tmp_path, CLIP.format(jump="100.0"))
    done, _, stderr = run_here("python", "script.py")
    assert done.code == 1, stderr
    f = done.report["findings"][0]
    assert (f["step"], f["phase"], f["op"], f["kind"], f["source"]) == \
        (4, "loss", "aten.exp.default", "inf", "script.py:15")
    said = " ".join(stderr.split())
    assert "watching image_encoder + text_encoder + logit_scale (961 parameters) and its optimizer AdamW " \
           "`optimizer`" in said


def test_a_lightning_gan_with_manual_optimization_is_watched(tmp_path, run_here):
    """Lightning's manual optimization (two optimizers stepped in training_step): the LightningModule holds both
    models; the generator's and discriminator's calls are replayed where they sit in it (`gen`, `disc`)."""
    pytest.importorskip("lightning.pytorch")
    write(tmp_path, LIGHTNING_GAN.format(lr_d="1e25"))
    done, _, stderr = run_here("python", "script.py")
    assert done.code == 1, stderr
    f = done.report["findings"][0]
    assert (f["step"], f["micro_step"], f["phase"], f["module"], f["op"], f["cause"]) == \
        (2, 1, "forward", "disc.2", "aten.addmm.default", "overflow")
