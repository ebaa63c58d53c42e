"""Trip on harm, through the CLI: healthy models whose module outputs or batches hold NaN/Inf on purpose are CLEAN."""

import textwrap

TASKS = textwrap.dedent('''
    from types import SimpleNamespace

    import torch
    import torch.nn.functional as F
    from torch import nn


    class CausalBias(nn.Module):
        """An additive causal bias: -inf above the diagonal, an output full of -inf by design."""

        def forward(self, n):
            return torch.full((n, n), float("-inf")).triu(1)


    class BiasedAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(8, 24)
            self.bias = CausalBias()
            self.head = nn.Linear(8, 1)

        def forward(self, x):
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            scores = q @ k.transpose(-1, -2) / 8 ** 0.5 + self.bias(x.shape[1])
            return self.head(torch.softmax(scores, dim=-1) @ v).squeeze(-1)


    def causal_bias():
        torch.manual_seed(0)
        batches = [{"x": torch.randn(4, 6, 8), "y": torch.randn(4, 6)} for _ in range(2)]
        return SimpleNamespace(model=BiasedAttention(), batches=batches,
                               loss=lambda m, b: F.mse_loss(m(b["x"]), b["y"]))


    class Policy(nn.Module):
        """RL idiom: invalid actions get -inf logits before the softmax."""

        def __init__(self):
            super().__init__()
            self.net = nn.Linear(8, 5)

        def forward(self, obs, valid):
            return self.net(obs).masked_fill(~valid, float("-inf"))


    def masked_logits():
        torch.manual_seed(0)
        valid = torch.ones(6, 5, dtype=torch.bool)
        valid[:, 3:] = False
        batches = [{"obs": torch.randn(6, 8), "valid": valid, "action": torch.randint(0, 3, (6,))}]
        return SimpleNamespace(model=Policy(), batches=batches,
                               loss=lambda m, b: F.cross_entropy(m(b["obs"], b["valid"]), b["action"]))


    def nan_padding():
        """Targets padded with NaN on purpose; the loss compares with their nanmean only."""
        torch.manual_seed(0)
        y = torch.randn(6)
        y[4:] = float("nan")
        batches = [{"x": torch.randn(6, 8), "y": y}]
        model = nn.Sequential(nn.Linear(8, 1), nn.Flatten(0))
        return SimpleNamespace(model=model, batches=batches,
                               loss=lambda m, b: ((m(b["x"]) - torch.nanmean(b["y"])) ** 2).mean())
''')


def _task(tmp_path, name: str) -> list[str]:
    path = tmp_path / "purposeful.py"
    path.write_text(TASKS)
    return ["--task", f"{path}:{name}", "--device", "cpu", "--max-steps", "3"]


def test_minus_inf_bias_output_is_clean(run_cli, tmp_path):
    run = run_cli(*_task(tmp_path, "causal_bias"))
    assert run.code == 0 and run.report["status"] == "clean" and run.report["steps_run"] == 3, run.output
    history = run.report["history"]
    assert [h["max_abs_activation"]["bias"] for h in history] == ["inf"] * 3  # recorded, not a trip
    assert all(isinstance(h["max_abs_activation"]["qkv"], float) for h in history)


def test_rl_masked_logits_are_clean(run_cli, tmp_path):
    run = run_cli(*_task(tmp_path, "masked_logits"))
    assert run.code == 0 and run.report["status"] == "clean", run.output


def test_nan_padding_consumed_by_nanmean_is_clean(run_cli, tmp_path):
    run = run_cli(*_task(tmp_path, "nan_padding"))
    assert run.code == 0 and run.report["status"] == "clean", run.output
    assert all(h["loss"] is not None and h["loss"] > 0 for h in run.report["history"])
