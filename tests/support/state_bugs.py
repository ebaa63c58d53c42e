"""NaN/Inf bugs of public reports where the NaN lives in STATE (buffers, a learning rate in `param_groups`, a
checkpoint) or where the tracer once misread it, rebuilt as `--task` plug-ins. Each factory names the thread it
rebuilds and the origin expected from first principles; tests/e2e/cli/test_state_bugs.py asserts them, and each
bug's fixed version is clean. Run one by hand, e.g.
    debug-nan --task tests/support/state_bugs.py:vqvae_ema_dead_code --max-steps 3 --device cpu
"""

from types import SimpleNamespace

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

D = 8


def _batches(n: int, make, seed: int = 0) -> list:
    g = torch.Generator().manual_seed(seed)
    return [make(i, g) for i in range(n)]


# -- VQ-VAE with an EMA codebook: zalandoresearch/pytorch-vq-vae#5, rosinality/vq-vae-2-pytorch#72,
#    ZhangXInFD/SpeechTokenizer#18 ---------------------------------------------------------------------------------
class EmaCodebook(nn.Module):
    """The EMA vector quantiser of the VQ-VAE paper's appendix: cluster sizes start at 0, and a code no input chose
    keeps cluster size 0 and embedding sum 0, so its new embedding is 0/0 = NaN (no Laplace smoothing:
    rosinality#72, SpeechTokenizer#18). The update runs under no_grad after the codes were chosen: the step that
    writes the NaN is finite; the next step's distances to the NaN code are NaN and argmin picks it."""

    def __init__(self, codes: int, dim: int, smoothing: bool):
        super().__init__()
        self.smoothing, self.decay = smoothing, 0.9
        self.register_buffer("embed", torch.randn(codes, dim))
        self.register_buffer("cluster_size", torch.zeros(codes))
        self.register_buffer("embed_sum", torch.zeros(codes, dim))

    def forward(self, z):  # z [N, dim]
        dist = (z * z).sum(1, keepdim=True) - 2 * z @ self.embed.t() + (self.embed * self.embed).sum(1)
        onehot = F.one_hot(dist.argmin(1), self.embed.shape[0]).type(z.dtype)
        quantized = onehot @ self.embed
        if self.training:
            with torch.no_grad():
                self.cluster_size.mul_(self.decay).add_(onehot.sum(0), alpha=1 - self.decay)
                self.embed_sum.mul_(self.decay).add_(onehot.t() @ z, alpha=1 - self.decay)
                size = self.cluster_size
                if self.smoothing:  # Laplace smoothing, as the reference implementations do
                    n = size.sum()
                    size = (size + 1e-5) / (n + size.numel() * 1e-5) * n
                self.embed.copy_(self.embed_sum / size.unsqueeze(1))
        return z + (quantized - z).detach(), F.mse_loss(z, quantized)


def _vqvae(smoothing: bool):
    torch.manual_seed(0)
    model = nn.ModuleDict({"enc": nn.Linear(D, 4), "vq": EmaCodebook(16, 4, smoothing), "dec": nn.Linear(4, D)})

    def loss(m, b):
        q, commit = m["vq"](m["enc"](b["x"]))
        return F.mse_loss(m["dec"](q), b["x"]) + 0.25 * commit

    batches = _batches(3, lambda i, g: {"x": torch.randn(6, D, generator=g)})
    return SimpleNamespace(model=model, loss=loss, batches=batches)


def vqvae_ema_dead_code():
    """6 inputs choose at most 6 of 16 codes in step 1: the other codes' cluster size and sum stay 0, and
    `embed_sum / cluster_size` writes 0/0 = NaN into buffer `vq.embed` (finite loss, gradients, parameters in
    step 1). Step 2's loss is NaN. Expected: step 1, micro-batch 1, forward, module `vq`, aten.div.Tensor, nan,
    div_by_zero; the watch of step 2 saw the harm."""
    return _vqvae(smoothing=False)


def vqvae_ema_smoothed():
    """The fix (Laplace smoothing of the cluster sizes): clean."""
    return _vqvae(smoothing=True)


# -- a hand-written BatchNorm whose running variance is unbiased: facebookresearch/SparseConvNet#190, torch/nn#1271
#    (the same NaN in Lua torch's BatchNormalization.running_var, fixed there for batches of one) ------------------
class RunningNorm(nn.Module):
    """BatchNorm semantics written by hand (as SparseConvNet's): the batch is normalised with the biased variance
    (finite for one sample: 0 + eps), the running variance is updated with the unbiased one, n / (n - 1), which
    for a batch of ONE sample is 0/0 (SparseConvNet#190: "a batch size of 1 producing nan in running_var"). Only the
    eval pass, which normalises with the running statistics, turns NaN."""

    def __init__(self, features: int, unbiased: bool):
        super().__init__()
        self.unbiased = unbiased
        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("running_var", torch.ones(features))

    def forward(self, x):  # x [N, features]
        if not self.training:
            return (x - self.running_mean) / torch.sqrt(self.running_var + 1e-5)
        mean, var = x.mean(0), x.var(0, correction=0)
        with torch.no_grad():
            self.running_mean.lerp_(mean, 0.1)
            self.running_var.lerp_(x.var(0) if self.unbiased else var, 0.1)
        return (x - mean) / torch.sqrt(var + 1e-5)


def _running_norm(unbiased: bool):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, D), RunningNorm(D, unbiased), nn.Linear(D, 1), nn.Flatten(0))

    def make(i, g):
        n = 1 if i == 1 else 6  # the last batch of an epoch holds one sample
        return {"x": torch.randn(n, D, generator=g), "y": torch.randn(n, generator=g)}

    return SimpleNamespace(model=model, loss=lambda m, b: F.mse_loss(m(b["x"]), b["y"]), batches=_batches(3, make),
                           eval_batches=_batches(1, make, seed=1))


def running_var_of_one_sample():
    """Step 2's batch holds one sample: `x.var(0)` (correction 1) is 0/0 and lerp_ writes NaN into buffer
    `1.running_var`; training stays finite. The eval pass after step 2 is NaN. Expected (with --eval-every 2):
    step 2, forward, module `1` (RunningNorm), aten.var.correction, nan, div_by_zero; not "eval"."""
    return _running_norm(unbiased=True)


def running_var_biased():
    """The fix (the biased variance for the running statistic too): clean, eval included."""
    return _running_norm(unbiased=False)


# -- an Inf into a BatchNorm in training mode: pytorch/pytorch#90342 ----------------------------------------------
def _conv_bn(scale: float, normalise: bool):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(36, 1),
                          nn.Flatten(0))
    nn.init.normal_(model[0].weight, std=1.0)  # the user's own init: unit-variance weights over 18 inputs

    def make(i, g):
        x = torch.randn(4, 2, 5, 5, generator=g)
        if i == 1 and not normalise:  # the fix: the data pipeline standardises every sample
            x[0] = scale  # one sample of the second batch in raw units, at the edge of float32
        return {"x": x, "y": torch.randn(4, generator=g)}

    return SimpleNamespace(model=model, loss=lambda m, b: F.mse_loss(m(b["x"]), b["y"]), batches=_batches(3, make))


def conv_overflow_into_batch_norm():
    """The thread: an overflowing activation (fp16 there; here a sample of constant 1e38 under N(0, 1) weights: a
    sum of 18 such terms exceeds the float32 maximum 3.4e38 at some positions) enters a BatchNorm in training
    mode; its batch mean is Inf, x - mean is inf - inf = NaN, and native_batch_norm writes NaN into
    running_mean/var itself. Expected: step 2, forward, module `0` (Conv2d), aten.convolution.default, inf,
    overflow (an intermediate: the exact sums fit); not the buffer."""
    return _conv_bn(1e38, normalise=False)


def conv_overflow_into_batch_norm_fp16():
    """The thread as it happened, under fp16 autocast: a sample of constant 3e4 (fp16 holds it) makes the fp16
    convolution exceed 65504; BatchNorm (run in float32 by autocast) gets the Inf and writes NaN into its running
    statistics, a step GradScaler would silently skip. Expected (--precision fp16): step 2, forward, module `0`,
    aten.convolution.default, inf, overflow (float64 gives about 8.8e4: beyond fp16, not a pole)."""
    return _conv_bn(3e4, normalise=False)


def conv_large_input_quietly_poisons_running_var():
    """The thread's quiet half: a sample of constant 1e30 stays finite through the convolution (about 1e31), but
    its variance (1e62) overflows float32 inside native_batch_norm, which writes +Inf into `1.running_var`; the
    training outputs and loss stay finite (that channel normalises to 0). Expected: clean, a note naming the
    buffer's writer (native_batch_norm, step 2) and a warning that module `0`'s output reached ~1e31."""
    return _conv_bn(1e30, normalise=False)


def conv_input_normalised():
    """The fix: the same batch standardised per sample: clean."""
    return _conv_bn(1e38, normalise=True)


# -- a poly schedule stepped past its end: meetps/pytorch-semseg#186 ------------------------------------------------
def _poly(total: int, clamp: bool):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, D), nn.Tanh(), nn.Linear(D, 1), nn.Flatten(0))

    def factor(step: int) -> float:
        done = np.float64(step) / total  # NumPy scalars: a negative base to a fractional power is NaN, not complex
        return float((1 - (min(done, 1.0) if clamp else done)) ** 0.9)

    return SimpleNamespace(
        model=model, loss=lambda m, b: F.mse_loss(m(b["x"]), b["y"]),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.01, momentum=0.9),
        scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, factor),
        batches=_batches(6, lambda i, g: {"x": torch.randn(8, D, generator=g), "y": torch.randn(8, generator=g)}))


def poly_lr_past_its_end():
    """`base_lr * (1 - step / max_iter) ** 0.9` with max_iter 3 (the thread: "after epoch exceeds max_iter, the
    factor becomes negative"): after the 4th step the factor is (-1/3) ** 0.9 = NaN, the lr in param_groups is NaN,
    and step 5's SGD update writes NaN into every parameter. Expected: step 5, optimizer, a NaN lr in the
    evidence, the schedule (LambdaLR) and its step named."""
    return _poly(3, clamp=False)


def poly_lr_past_its_end_evaluated():
    """The same, with an eval pass (--eval-every 4 runs one after step 4, which reads the parameters of update 4
    before step 5 begins): the same finding."""
    task = _poly(3, clamp=False)
    task.eval_batches = task.batches[:2]
    return task


def poly_lr_clamped():
    """The fix: the schedule holds at 0 past its end: clean."""
    return _poly(3, clamp=True)


# -- a NaN saved into a checkpoint: Rikorose/DeepFilterNet#30 (the last checkpoint holds NaN weights),
#    NVIDIA-NeMo/RL#3544 (restoring the optimizer state gives NaN losses), NVIDIA/tacotron2#283 (NaN right after
#    restarting from the last checkpoint, answered with "reduce the learning rate") -----------------------------
def resumed_model():
    """Resumed with --checkpoint from a file whose `0.weight` (or Adam's exp_avg_sq of it) holds NaN, written by
    the run that saved it: nothing in the resumed run writes it, so no learning rate can be the cause. Expected: step
    (checkpoint step + 1), the named tensor, nonfinite_parameter, the explanation naming the checkpoint; no "lower the
    learning rate"."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, D), nn.Tanh(), nn.Linear(D, 1), nn.Flatten(0))
    return SimpleNamespace(
        model=model, loss=lambda m, b: F.mse_loss(m(b["x"]), b["y"]),
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        batches=_batches(4, lambda i, g: {"x": torch.randn(8, D, generator=g), "y": torch.randn(8, generator=g)}))


def save_checkpoint(path, poison: str | None) -> None:
    """A checkpoint of resumed_model() after one AdamW step (step 7 of the saving run), with `poison`: "weight"
    (a NaN in 0.weight), "adam" (a NaN in its exp_avg_sq) or None (healthy)."""
    t = resumed_model()
    opt = t.optimizer(t.model.parameters())
    t.loss(t.model, t.batches[0]).backward()
    opt.step()
    model, optim = t.model.state_dict(), opt.state_dict()
    if poison == "weight":
        model["0.weight"][2, 3] = float("nan")
    elif poison == "adam":
        optim["state"][0]["exp_avg_sq"][1, 1] = float("nan")
    torch.save({"model": model, "optimizer": optim, "step": 7}, path)


# -- a VAE's unbounded log-variance: vanderschaarlab/synthcity#331 -------------------------------------------------
class Vae(nn.Module):
    def __init__(self, clamp: bool):
        super().__init__()
        self.clamp = clamp
        self.enc = nn.Linear(D, 8)  # -> mu [4], logvar [4]
        self.dec = nn.Linear(4, D)

    def forward(self, x):
        mu, logvar = self.enc(x).chunk(2, dim=-1)
        if self.clamp:  # the fix the thread proposes (diffusers clamps to [-30, 20])
            logvar = logvar.clamp(-30.0, 20.0)
        std = torch.exp(0.5 * logvar)
        return self.dec(mu + std * torch.randn_like(std)), mu, logvar


def _vae(clamp: bool):
    torch.manual_seed(0)
    model = Vae(clamp)

    def make(i, g):
        x = torch.randn(6, D, generator=g)
        if i == 1:
            x[2] = 1e4  # one unnormalised sample (raw counts)
        return {"x": x}

    def loss(m, b):
        recon, mu, logvar = m(b["x"])
        kl = -0.5 * (1 + logvar - mu ** 2 - logvar.exp()).sum(-1).mean()
        return F.mse_loss(recon, b["x"]) + 1e-3 * kl

    return SimpleNamespace(model=model, loss=loss, batches=_batches(3, make))


def vae_logvar_exp_overflow():
    """The second batch holds a sample of constant 1e4: the encoder's logvar reaches a few thousand, and
    exp(0.5 * logvar) is about 10^(700+): past float32 AND float64, yet exp has no pole at a finite input, so it is
    an overflow. Expected: step 2, forward, module `` (Vae, the model itself), aten.exp.default, inf, overflow."""
    return _vae(clamp=False)


def vae_logvar_clamped():
    """The fix (logvar clamped to [-30, 20]): clean of NaN/Inf. The unnormalised sample still makes a gradient of
    about 1e8, which the explosion check reports at its default threshold: run both with --explosion-threshold
    1e12 to compare the exp alone."""
    return _vae(clamp=True)


# -- weight norm over a zero-initialised row: pytorch/pytorch#19126 -------------------------------------------------
def _weight_norm(zero_row: bool):
    torch.manual_seed(0)
    head = nn.Linear(D, 3)
    if zero_row:  # "zero-init the output layer", then weight norm on it: g * v / ||v|| with ||v|| = 0
        with torch.no_grad():
            head.weight[1] = 0.0
    model = nn.Sequential(nn.Linear(D, D), nn.ReLU(), nn.utils.parametrizations.weight_norm(head))
    return SimpleNamespace(model=model, loss=lambda m, b: F.cross_entropy(m(b["x"]), b["y"]), batches=_batches(
        2, lambda i, g: {"x": torch.randn(6, D, generator=g), "y": torch.randint(0, 3, (6,), generator=g)}))


def weight_norm_zero_row():
    """Row 1 of the weight-normed head is zero: its norm is 0, and w = g * v / ||v|| is 0/0 = NaN in the forward
    (the thread met it in the backward). Expected: step 1, forward, module `2`, aten._weight_norm_interface.default,
    nan, div_by_zero (an op no rule lists, named from its input's all-zero slice)."""
    return _weight_norm(zero_row=True)


def weight_norm_random_init():
    """The fix (no zero row under weight norm): clean."""
    return _weight_norm(zero_row=False)


# -- quiet failures: finite, yet not training ----------------------------------------------------------------------
def _summed(summed: bool):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 64), nn.Tanh(), nn.Linear(64, 1), nn.Flatten(0))
    scale = 30.0 if summed else 1.0  # targets in raw units, or standardised
    return SimpleNamespace(model=model, loss=lambda m, b: F.mse_loss(m(b["x"]), b["y"], reduction="sum" if summed
                                                                     else "mean"),
                           batches=_batches(4, lambda i, g: {"x": torch.randn(256, D, generator=g),
                                                            "y": scale * torch.randn(256, generator=g)}))


def scaler_skips_every_step():
    """pytorch/pytorch#67590 (GradScaler silently skips optimizer.step on Inf gradients): a loss summed over 256
    samples with targets of size 30 has gradients near 1e5; times the initial fp16 scale 65536 they pass fp16's
    65504 in every step of a short run, so every step is skipped and the model never updates, with nothing
    non-finite at the true scale. Expected (--precision fp16, 3 steps): clean, and a warning that the scaler
    skipped every step."""
    return _summed(True)


def scaler_mean_loss():
    """The fix (a mean loss of standardised targets: small gradients): steps are taken; no warning."""
    return _summed(False)


# -- a completion-only collate whose response template never matches: huggingface/trl#1820 -----------------------
RESPONSE = [7, 8]  # "### Answer:" as the collate searches for it; the tokenizer merged it into [9] in the text


def _completion_lm(template_in_text: list[int], loss_kind: str):
    """A tiny causal LM; the collate sets every label up to and including the response template to -100, and all
    of them when the template is not found (trl's DataCollatorForCompletionOnlyLM, with its warning)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(32, D), nn.Linear(D, 32))

    def make(i, g):
        prompt, answer = torch.randint(10, 32, (4, 5), generator=g), torch.randint(10, 32, (4, 3), generator=g)
        tokens = torch.cat([prompt, torch.tensor(template_in_text).repeat(4, 1), answer], 1)
        labels = torch.full_like(tokens, -100)
        if template_in_text == RESPONSE:
            labels[:, 5 + len(RESPONSE):] = answer
        return {"tokens": tokens, "labels": labels}

    def loss(m, b):
        logits = m(b["tokens"][:, :-1]).reshape(-1, 32)
        labels = b["labels"][:, 1:].reshape(-1)
        if loss_kind == "mean":
            return F.cross_entropy(logits, labels)
        # "sum / count" with the count clamped to 1: no NaN, and nothing learned either
        return F.cross_entropy(logits, labels, reduction="sum") / (labels != -100).sum().clamp_min(1)

    return SimpleNamespace(model=model, loss=loss, batches=_batches(4, make))


def completion_labels_all_ignored():
    """Every sample's template is tokenised as [9], never [7, 8]: every label is -100, and the mean cross-entropy
    divides a sum over 0 targets by 0. Expected: step 1, loss, aten.nll_loss_forward.default, nan, div_by_zero,
    the first suggestion about the data (and num_items_in_batch), no "add an epsilon"."""
    return _completion_lm([9], "mean")


def completion_labels_all_ignored_clamped():
    """The same data with the count clamped to 1 (the "epsilon in the denominator" fix): the loss is exactly 0 and
    so is every gradient: clean, and a warning that the gradient norm was exactly 0 for every step."""
    return _completion_lm([9], "clamped")


def completion_template_found():
    """The fix (the template as the text tokenises it): labels on the answers; clean, no warning."""
    return _completion_lm(RESPONSE, "mean")


# -- evidence that agrees with the notes: an Inf that a module output showed, dropped by the loss --------------------
class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(D, 2)

    def forward(self, x):
        h = self.lin(x)
        return torch.stack([h[:, 0], torch.exp(80 * h[:, 1])], 1)  # a scale head that overflows float32


def dropped_head_output():
    """The scale head's exp overflows to Inf in the module output `head`, the loss reads only column 0, and the
    backward of exp multiplies the zero gradient by Inf: NaN gradients. Expected: forward, module `head`,
    aten.exp.default, inf, overflow; the evidence says module output `head` held it (as the note does), not that
    it was hidden before every module output."""
    torch.manual_seed(0)
    model = nn.ModuleDict({"head": TwoHeads()})
    return SimpleNamespace(model=model, loss=lambda m, b: F.mse_loss(m["head"](b["x"])[:, 0], b["y"]),
                           batches=_batches(2, lambda i, g: {"x": torch.randn(8, D, generator=g),
                                                            "y": torch.randn(8, generator=g)}))


# -- a buffer written outside the forward: an update after the optimizer step --------------------------------------
def buffer_written_after_the_step():
    """A weight average kept in a buffer by an optimizer step hook, `avg = sum / count` with a count that is 0 after
    step 2 (a reset bug): the buffer turns NaN outside the forward and loss, which no replay runs. Expected: clean
    (the buffer is never read), and a note that says where it could not be traced, not a made-up op."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, 1), nn.Flatten(0))
    model.register_buffer("avg", torch.zeros(1, D))

    def optimizer(params):
        opt = torch.optim.SGD(params, lr=0.01)
        steps = [0]

        def average(*_):
            steps[0] += 1
            count = 0.0 if steps[0] == 2 else float(steps[0])
            with torch.no_grad():
                model.avg.copy_(model[0].weight * steps[0] / count)

        opt.register_step_post_hook(average)
        return opt

    return SimpleNamespace(model=model, loss=lambda m, b: F.mse_loss(m(b["x"]), b["y"]), optimizer=optimizer,
                           batches=_batches(4, lambda i, g: {"x": torch.randn(4, D, generator=g),
                                                            "y": torch.randn(4, generator=g)}))


# -- a running target normaliser fed one-sample batches: pokaxpoka/B_Pref#3 ------------------------------------------
class TargetNormaliser(nn.Module):
    """TorchRunningMeanStd as in the thread: the targets are standardised with the running statistics, which are
    then merged with the batch's, using the batch's UNBIASED variance (NaN for a batch of one element)."""

    def __init__(self, unbiased: bool):
        super().__init__()
        self.unbiased = unbiased
        self.register_buffer("mean", torch.zeros(()))
        self.register_buffer("var", torch.ones(()))
        self.register_buffer("count", torch.tensor(1e-4))

    def forward(self, y):
        out = (y - self.mean) / torch.sqrt(self.var + 1e-8)
        with torch.no_grad():
            n, batch_mean, batch_var = y.numel(), y.mean(), y.var(correction=1 if self.unbiased else 0)
            delta, total = batch_mean - self.mean, self.count + n
            self.var.copy_((self.var * self.count + batch_var * n + delta ** 2 * self.count * n / total) / total)
            self.mean.add_(delta * n / total)
            self.count.copy_(total)
        return out


def _target_norm(unbiased: bool):
    torch.manual_seed(0)
    model = nn.ModuleDict({"net": nn.Sequential(nn.Linear(D, 1), nn.Flatten(0)), "norm": TargetNormaliser(unbiased)})

    def make(i, g):
        n = 1 if i == 1 else 8  # the second batch holds one transition
        return {"x": torch.randn(n, D, generator=g), "y": 5 + 3 * torch.randn(n, generator=g)}

    return SimpleNamespace(model=model, loss=lambda m, b: F.mse_loss(m["net"](b["x"]), m["norm"](b["y"])),
                           batches=_batches(4, make))


def target_normaliser_one_sample():
    """Step 2's batch has one element: its unbiased variance is 0/0 and the update writes NaN into buffer
    `norm.var` (step 2's loss used the old statistics: finite). Step 3 standardises with NaN. Expected: step 2,
    forward, module `norm` (TargetNormaliser), aten.var.correction, nan, div_by_zero; the harm at step 3."""
    return _target_norm(unbiased=True)


def target_normaliser_biased():
    """The fix the thread proposes (the biased batch variance, 0 for one element): clean."""
    return _target_norm(unbiased=False)


def nan_initialised_weight():
    """A custom init scales a layer by 1 / fan_in with a fan-in computed as 0 (a zero-size dimension counted): its
    weight is Inf/NaN before the first step. Expected: step 1, the weight named as non-finite before the run's
    first step, not "an earlier step"."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(D, D), nn.Tanh(), nn.Linear(D, 1), nn.Flatten(0))
    with torch.no_grad():
        model[2].weight.mul_(0.0).div_(0.0)  # 0 * w / 0: the init's 0/0
    return SimpleNamespace(model=model, loss=lambda m, b: F.mse_loss(m(b["x"]), b["y"]), batches=_batches(
        2, lambda i, g: {"x": torch.randn(4, D, generator=g), "y": torch.randn(4, generator=g)}))
