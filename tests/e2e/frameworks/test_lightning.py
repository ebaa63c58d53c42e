"""The Lightning callback on tiny models (CPU, seconds each): clean runs are the user's run bit for bit, planted
bugs give the CLI's finding, and accumulation, bf16 autocast and an fp16 GradScaler keep working."""

import json

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from lightning.pytorch.plugins import MixedPrecision  # noqa: E402
from torch.utils.data import DataLoader  # noqa: E402

import debug_nan  # noqa: E402
from debug_nan.errors import InputError  # noqa: E402
from debug_nan.integrations.lightning import DebugNaNCallback  # noqa: E402
from tests.support import models  # noqa: E402
from tests.support.frameworks import tasks  # noqa: E402

TASKS = tasks.__file__


def lit(net_cls, loss, make_optimizer=tasks.optimizer):
    """A LightningModule that IS net_cls (same parameter and module names as the --task model)."""

    class Lit(net_cls, pl.LightningModule):
        def training_step(self, batch, batch_idx):
            value = loss(self, batch)
            self.log("train_loss", value)
            return value

        def configure_optimizers(self):
            return make_optimizer(self.parameters())

    torch.manual_seed(0)
    return Lit()


def fit(module, batches, callback=None, steps=6, accumulate=1, **trainer_args):
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, accumulate_grad_batches=accumulate,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[callback] if callback else [], **trainer_args)
    trainer.fit(module, DataLoader(batches, batch_size=None))
    return trainer


def params(module):
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def assert_identical(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


FIELDS = ("step", "micro_step", "phase", "module", "op", "cause")


@pytest.mark.parametrize("accumulate", [1, 2])
def test_healthy_run_is_clean_and_bit_identical(tmp_path, accumulate):
    plain = lit(tasks.Net, tasks.net_loss)
    fit(plain, tasks.masked_batches(), accumulate=accumulate)
    watched = lit(tasks.Net, tasks.net_loss)
    callback = DebugNaNCallback(report=str(tmp_path / "r.json"))
    fit(watched, tasks.masked_batches(), callback, accumulate=accumulate)
    assert_identical(params(plain), params(watched))
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["status"], report["steps_run"], report["first_nonfinite"]) == ("clean", 6, None)
    assert report["integration"]["framework"] == "lightning"
    assert report["settings"]["gradient_accumulation_steps"] == accumulate
    assert [h["step"] for h in report["history"]] == [1, 2, 3, 4, 5, 6]
    assert all(h["loss"] > 0 and h["grad_norm"] > 0 for h in report["history"])
    assert callback.status == "clean" and callback.finding is None
    assert not list(tmp_path.glob("*.pt"))  # no bundle without a finding


@pytest.mark.parametrize("accumulate, where", [(1, (4, 1)), (2, (2, 2))])
def test_planted_bug_same_finding_as_the_cli(tmp_path, run_cli, accumulate, where, capsys):
    module = lit(tasks.Net, tasks.net_loss)
    callback = DebugNaNCallback(report=str(tmp_path / "r.json"))
    trainer = fit(module, tasks.masked_batches(empty_at=(3,)), callback, accumulate=accumulate)
    streams = capsys.readouterr()
    out = streams.err  # debug-nan's lines: the script's stdout stays its own
    assert streams.out == "", streams.out
    f = callback.finding
    assert (f.step, f.micro_step) == where
    assert (f.phase, f.module, f.op, f.cause) == ("forward", "attn", "aten._softmax.default", "all_masked_softmax")
    cli = run_cli("--task", f"{TASKS}:masked_attention", "--device", "cpu", "--max-steps", "6", "--max-grad-norm",
                  "0", "--warmup-steps", "0", "--gradient-accumulation-steps", str(accumulate), "--no-bundle")
    assert cli.code == 1, cli.output
    assert {k: cli.first[k] for k in FIELDS} == {k: getattr(f, k) for k in FIELDS}
    # the summary block and the report of the CLI; training stopped at the trip
    assert "status       NONFINITE" in out and "cause        all_masked_softmax" in out
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "nonfinite" and report["first_nonfinite"]["cause"] == "all_masked_softmax"
    assert trainer.global_step == where[0] and trainer.should_stop
    bundle = tmp_path / f"debug-nan-bundle-step{where[0]}-micro{where[1]}.pt"
    assert report["first_nonfinite"]["bundle"] == str(bundle) and bundle.is_file()


def test_model_is_left_at_its_last_finite_state():
    """After the trip at step 4 the module holds what 3 clean steps gave, bit for bit, and no gradient."""
    clean = lit(tasks.Net, tasks.net_loss)
    fit(clean, tasks.masked_batches(empty_at=(3,)), steps=3)
    tripped = lit(tasks.Net, tasks.net_loss)
    fit(tripped, tasks.masked_batches(empty_at=(3,)), DebugNaNCallback(bundle=False))
    assert_identical(params(clean), params(tripped))
    assert all(p.grad is None for p in tripped.parameters())


def test_on_trip_raise_raises_out_of_fit():
    module = lit(tasks.Net, tasks.net_loss)
    with pytest.raises(debug_nan.NonFiniteError) as info:
        fit(module, tasks.masked_batches(empty_at=(1,)), DebugNaNCallback(on_trip="raise"))
    assert (info.value.finding.step, info.value.finding.cause) == (2, "all_masked_softmax")


def test_users_own_exception_is_pinpointed_and_still_raised(tmp_path):
    module = lit(tasks.Net, tasks.net_loss_refusing_nan)
    callback = DebugNaNCallback(report=str(tmp_path / "r.json"), bundle=False)
    with pytest.raises(ValueError, match="NaN in the predictions"):
        fit(module, tasks.masked_batches(empty_at=(1,)), callback)
    f = json.loads((tmp_path / "r.json").read_text())["first_nonfinite"]
    assert (f["step"], f["phase"], f["module"], f["cause"]) == (2, "forward", "attn", "all_masked_softmax")
    assert f["exception"].startswith("ValueError: NaN in the predictions")


def test_bf16_autocast_clean_and_planted():
    plain, watched = lit(tasks.Net, tasks.net_loss), lit(tasks.Net, tasks.net_loss)
    fit(plain, tasks.masked_batches(), precision="bf16-mixed")
    callback = DebugNaNCallback(bundle=False)
    fit(watched, tasks.masked_batches(), callback, precision="bf16-mixed")
    assert callback.status == "clean"
    assert_identical(params(plain), params(watched))
    callback = DebugNaNCallback(bundle=False)
    fit(lit(tasks.Net, tasks.net_loss), tasks.masked_batches(empty_at=(3,)), callback, accumulate=2,
        precision="bf16-mixed")
    f = callback.finding
    assert (f.step, f.micro_step, f.module, f.cause) == (2, 2, "attn", "all_masked_softmax")


def fp16():
    """Lightning turns precision='16-mixed' on a CPU into bf16: the fp16 plugin with a CPU GradScaler, explicitly."""
    return {"plugins": [MixedPrecision("16-mixed", "cpu", torch.amp.GradScaler("cpu"))]}


@pytest.mark.parametrize("accumulate", [1, 2])
def test_fp16_scaler_overflow_steps_are_not_findings_and_the_run_is_unchanged(capsys, accumulate):
    plain, watched = lit(tasks.Wide, tasks.sum_loss), lit(tasks.Wide, tasks.sum_loss)
    plain_trainer = fit(plain, tasks.plain_batches(), accumulate=accumulate, **fp16())
    callback = DebugNaNCallback(bundle=False)
    trainer = fit(watched, tasks.plain_batches(), callback, accumulate=accumulate, **fp16())
    streams = capsys.readouterr()
    out = streams.err  # debug-nan's lines: the script's stdout stays its own
    assert streams.out == "" and callback.status == "clean", out
    assert out.count("skipped by the GradScaler: scale 65536 ->") == 1  # one line for the run of skipped steps
    assert trainer.precision_plugin.scaler.get_scale() == plain_trainer.precision_plugin.scaler.get_scale() < 65536
    assert_identical(params(plain), params(watched))  # the probe re-ran the step without disturbing it


def test_fp16_genuine_nan_gradient_is_a_finding():
    callback = DebugNaNCallback(bundle=False)
    fit(lit(tasks.Distances, tasks.distance_loss), tasks.plain_batches(), callback, **fp16())
    f = callback.finding
    assert (f.step, f.phase, f.cause) == (1, "backward", "grad_at_singularity")


def test_optimizer_step_that_made_a_parameter_nan():
    callback = DebugNaNCallback(bundle=False)
    module = lit(models.Gated, tasks.mse_loss, lambda p: torch.optim.Adam(p, lr=1e-2, eps=0.0))
    fit(module, tasks.plain_batches(), callback)
    f = callback.finding
    assert (f.step, f.phase, f.cause) == (1, "optimizer", "nonfinite_parameter")
    assert "unused_scale" in f.explanation
    assert all(torch.isfinite(p).all() for p in module.parameters())  # the bad update was undone


def test_bundle_replays_through_the_cli(tmp_path, run_cli):
    callback = DebugNaNCallback(bundle_dir=str(tmp_path), task=f"{TASKS}:masked_attention")
    fit(lit(tasks.Net, tasks.net_loss), tasks.masked_batches(empty_at=(3,)), callback, accumulate=2)
    bundle = tmp_path / "debug-nan-bundle-step2-micro2.pt"
    replay = run_cli("replay", str(bundle), "--device", "cpu")
    assert replay.code == 1, replay.output
    assert {k: replay.first[k] for k in FIELDS} == {k: getattr(callback.finding, k) for k in FIELDS}
    assert "Same origin as recorded in the bundle." in replay.output


def test_unsupported_setups_are_refused():
    class Manual(tasks.Net, pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

        def training_step(self, batch, batch_idx):
            return None

        def configure_optimizers(self):
            return tasks.optimizer(self.parameters())

    with pytest.raises(InputError, match="automatic optimization only"):
        fit(Manual(), tasks.masked_batches(), DebugNaNCallback())
    with pytest.raises(InputError, match="on_trip='nope'"):
        DebugNaNCallback(on_trip="nope")
