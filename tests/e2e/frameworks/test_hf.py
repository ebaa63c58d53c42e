"""The HF Trainer callback on a tiny BERT built from a config (CPU, no download): clean runs are the user's run bit
for bit, a planted bug gives the CLI's finding, with gradient accumulation and bf16 autocast."""

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")

import debug_nan  # noqa: E402
from debug_nan.errors import InputError  # noqa: E402
from debug_nan.integrations.hf import DebugNaNCallback  # noqa: E402
from tests.support.frameworks import tasks  # noqa: E402

TASKS = tasks.__file__
FIELDS = ("step", "micro_step", "phase", "module", "op", "cause")


def train(tmp_path, samples, watch=None, steps=6, accumulate=1, loss=tasks.per_sequence_loss, **args):
    """Train tiny_bert with the Trainer; `watch(trainer)` returns the callback to add (or None)."""
    model = tasks.tiny_bert()
    targs = transformers.TrainingArguments(**{
        "output_dir": str(tmp_path / "out"), "per_device_train_batch_size": tasks.HF_BATCH,
        "gradient_accumulation_steps": accumulate, "max_steps": steps, "learning_rate": tasks.LR, "report_to": [],
        "save_strategy": "no", "use_cpu": True, "disable_tqdm": True, "seed": 0,
        "train_sampling_strategy": "sequential", "logging_steps": 1000, **args})
    trainer = transformers.Trainer(model=model, args=targs, train_dataset=samples, compute_loss_func=loss)
    callback = watch(trainer) if watch else None
    if callback is not None:
        trainer.add_callback(callback)
    trainer.train()
    return trainer, callback


def state(trainer):
    return {k: v.detach().clone() for k, v in trainer.model.state_dict().items()}


def assert_identical(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("accumulate", [1, 2])
def test_healthy_run_is_clean_and_bit_identical(tmp_path, accumulate):
    plain, _ = train(tmp_path, tasks.mlm_samples(), accumulate=accumulate)
    trainer, callback = train(tmp_path, tasks.mlm_samples(),
                              lambda t: DebugNaNCallback(t, report=str(tmp_path / "r.json")), accumulate=accumulate)
    assert_identical(state(plain), state(trainer))
    report = json.loads((tmp_path / "r.json").read_text())
    assert (report["status"], report["steps_run"], report["first_nonfinite"]) == ("clean", 6, None)
    assert report["integration"]["framework"] == "transformers"
    assert report["settings"]["gradient_accumulation_steps"] == accumulate
    assert [h["step"] for h in report["history"]] == [1, 2, 3, 4, 5, 6]
    assert all(h["loss"] > 0 and h["grad_norm"] > 0 for h in report["history"])
    assert callback.status == "clean" and "training_step" not in trainer.__dict__  # the wrapper is gone


@pytest.mark.parametrize("accumulate, where", [(1, (4, 1)), (2, (2, 2))])
def test_planted_bug_same_finding_as_the_cli(tmp_path, run_cli, accumulate, where, capsys):
    trainer, callback = train(tmp_path, tasks.mlm_samples(unlabelled=(7,)),
                              lambda t: DebugNaNCallback(t, report=str(tmp_path / "r.json")), accumulate=accumulate)
    streams = capsys.readouterr()
    out = streams.err  # debug-nan's lines: the script's stdout stays its own
    assert "[debug-nan]" not in streams.out and "SUMMARY" not in streams.out
    f = callback.finding
    assert (f.step, f.micro_step) == where
    assert (f.phase, f.module, f.op, f.cause) == ("loss", "", "aten.div.Tensor", "div_by_zero")
    cli = run_cli("--task", f"{TASKS}:bert_unlabelled_sequence", "--device", "cpu", "--max-steps", "6",
                  "--max-grad-norm", "0", "--warmup-steps", "0", "--gradient-accumulation-steps", str(accumulate),
                  "--no-bundle")
    assert cli.code == 1, cli.output
    assert {k: cli.first[k] for k in FIELDS} == {k: getattr(f, k) for k in FIELDS}
    assert "status       NONFINITE" in out and "cause        div_by_zero" in out
    assert "exit 1" not in out and "(exit" not in out  # the script's process exits with the Trainer's code, not ours
    assert "--max-grad-norm" not in out  # advice in the Trainer's words: TrainingArguments(max_grad_norm=...)
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["exit_code"] is None
    assert report["status"] == "nonfinite" and report["first_nonfinite"]["source"].endswith(
        "tests/support/frameworks/tasks.py:" + cli.first["source"].rsplit(":", 1)[1])
    assert trainer.state.global_step == where[0]  # stopped at the trip (its update skipped: no gradients)
    bundle = tmp_path / f"debug-nan-bundle-step{where[0]}-micro{where[1]}.pt"
    assert report["first_nonfinite"]["bundle"] == str(bundle) and bundle.is_file()


def test_header_says_the_precision_accelerate_resolved(tmp_path, capsys):
    """fp16=True on a CPU: accelerate runs fp32 with no autocast and no scaler, and the header says so."""
    train(tmp_path, tasks.mlm_samples(), lambda t: DebugNaNCallback(t), steps=1, fp16=True)
    header = next(line for line in capsys.readouterr().err.splitlines() if "[debug-nan] watching" in line)
    assert "fp32: fp16 was asked, but accelerate runs fp32 on cpu (no autocast, no scaler)" in header


def test_model_is_left_at_its_last_finite_state(tmp_path):
    constant = {"lr_scheduler_type": "constant"}
    clean, _ = train(tmp_path, tasks.mlm_samples(unlabelled=(7,)), steps=3, **constant)
    tripped, _ = train(tmp_path, tasks.mlm_samples(unlabelled=(7,)), lambda t: DebugNaNCallback(t, bundle=False),
                       **constant)
    assert_identical(state(clean), state(tripped))


def test_on_trip_raise_raises_out_of_train(tmp_path):
    with pytest.raises(debug_nan.NonFiniteError) as info:
        train(tmp_path, tasks.mlm_samples(unlabelled=(2,)), lambda t: DebugNaNCallback(t, on_trip="raise"))
    assert (info.value.finding.step, info.value.finding.cause) == (2, "div_by_zero")


def test_users_own_exception_is_pinpointed_and_still_raised(tmp_path):
    def refusing(outputs, labels, num_items_in_batch=None):
        value = tasks.per_sequence_loss(outputs, labels)
        if torch.isnan(value):
            raise ValueError("NaN loss")
        return value

    holder = {}

    def watch(t):
        holder["cb"] = DebugNaNCallback(t, report=str(tmp_path / "r.json"), bundle=False)
        return holder["cb"]

    with pytest.raises(ValueError, match="NaN loss"):
        train(tmp_path, tasks.mlm_samples(unlabelled=(2,)), watch, loss=refusing)
    f = json.loads((tmp_path / "r.json").read_text())["first_nonfinite"]
    assert (f["step"], f["phase"], f["cause"]) == (2, "loss", "div_by_zero")
    assert f["exception"].startswith("ValueError: NaN loss")
    assert "training_step" not in holder["cb"].trainer.__dict__


def test_bf16_autocast_clean_and_planted(tmp_path):
    plain, _ = train(tmp_path, tasks.mlm_samples(), bf16=True)
    trainer, callback = train(tmp_path, tasks.mlm_samples(), lambda t: DebugNaNCallback(t, bundle=False), bf16=True)
    assert callback.status == "clean"
    assert_identical(state(plain), state(trainer))
    _, callback = train(tmp_path, tasks.mlm_samples(unlabelled=(7,)), lambda t: DebugNaNCallback(t, bundle=False),
                        accumulate=2, bf16=True)
    f = callback.finding
    assert (f.step, f.micro_step, f.phase, f.cause) == (2, 2, "loss", "div_by_zero")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="fp16 with a GradScaler: the Trainer does it on a GPU only")
def test_fp16_scaler_overflow_is_not_a_finding_on_cuda(tmp_path):
    plain, _ = train(tmp_path, tasks.mlm_samples(), fp16=True, use_cpu=False)
    trainer, callback = train(tmp_path, tasks.mlm_samples(), lambda t: DebugNaNCallback(t, bundle=False), fp16=True,
                              use_cpu=False)
    assert callback.status == "clean"
    assert_identical(state(plain), state(trainer))


def test_the_callback_needs_the_trainer_it_watches(tmp_path):
    with pytest.raises(InputError, match="needs the transformers.Trainer"):
        DebugNaNCallback(None)
    other, _ = train(tmp_path, tasks.mlm_samples(), steps=1)
    with pytest.raises(InputError, match="another Trainer"):
        train(tmp_path, tasks.mlm_samples(), lambda t: DebugNaNCallback(other))


def test_a_nan_learning_rate_names_the_trainers_schedule(tmp_path):
    """The Trainer's own scheduler (accelerate wraps it) writes NaN into the lr after 2 steps: the finding names
    that schedule and its step, as the CLI does for a task's scheduler (it is not 'no scheduler attached')."""
    from tests.support.frameworks import parity

    model, batches, make_optimizer = parity.build("healthy")
    samples = [{k: v[i] for k, v in b.items()} for b in batches for i in range(parity.BATCH)]
    optimizer = make_optimizer(model.parameters())
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0 if step < 2 else float("nan"))
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), per_device_train_batch_size=parity.BATCH,
                                          max_steps=5, max_grad_norm=0.0, report_to=[], save_strategy="no",
                                          use_cpu=True, disable_tqdm=True, logging_steps=1000)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=samples, optimizers=(optimizer, schedule))
    callback = DebugNaNCallback(trainer)
    trainer.add_callback(callback)
    trainer.train()
    f = callback.finding
    assert (f.step, f.phase, f.cause) == (3, "optimizer", "nonfinite_parameter")
    assert "the schedule LambdaLR set it after 2 of its steps" in f.explanation
