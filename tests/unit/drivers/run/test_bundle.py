"""A `run` bundle's pieces (drivers/run/bundle.py, Tape.portable): what pickles, by name or by value, and what a
bundle refuses to hold."""

import io
import pickle
import sys

import pytest
import torch
from torch import nn

from debug_nan import torch_support
from debug_nan.drivers.run import bundle
from debug_nan.drivers.run.tape import MODEL, Tape
from tests.unit.drivers.run.test_tape import forward

pytestmark = pytest.mark.skipif(bool(torch_support.save_options()), reason="torch < 2.6 on Python 3.13 writes no "
                                "`run` bundle (test_a_bundle_is_refused_where_torch_save_takes_no_pickler)")


def _dumps(module, obj) -> bytes:
    """What torch.save does with a `run` bundle's objects, minus its storage records."""
    buffer = io.BytesIO()
    module.Pickler(buffer, protocol=bundle.PROTOCOL).dump(obj)
    return buffer.getvalue()


def test_a_portable_tape_replays_after_pickling_with_its_operators_by_name(recorder):
    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    x, y = torch.randn(5, 4), torch.tensor([0, 2, 1, 1, 0])
    tape = recorder.tape = Tape(first_form="single")
    logits = forward(recorder, tape, model, x)
    loss = torch.ops.aten.mul.Tensor(nn.functional.cross_entropy(logits, y), 0.5)  # an operator of torch.ops
    recorder.tape = None
    tape.close((loss,), {})
    model_copy, copy = pickle.loads(_dumps(bundle.pickle_module(), (model, tape.portable())))
    assert copy.entries[0].func is MODEL  # the model's entry is the one sentinel again
    assert copy.entries[-1].func is torch.ops.aten.mul.Tensor
    values = copy.replay(model_copy, (x.clone(),), {})
    (replayed,), _ = copy.backward_args(values)
    assert torch.equal(replayed, loss)


def test_a_profiler_annotation_is_not_recorded(recorder):
    tape = recorder.tape = Tape()
    with torch.autograd.profiler.record_function("optimizer step"):  # what Optimizer.step wraps itself in
        torch.ones(2) * 3
    recorder.tape = None
    assert [getattr(e.func, "__name__", "") for e in tape.entries] == ["ones", "mul"]


def test_an_outside_tensor_changed_in_place_since_leaves_no_bundle(recorder):
    model = nn.Linear(4, 3)
    big = torch.zeros(1 << 17)  # past SMALL: kept with its version, not cloned
    tape = recorder.tape = Tape(first_form="single")
    out = forward(recorder, tape, model, torch.randn(2, 4))
    loss = out.sum() + big.sum()
    recorder.tape = None
    tape.close((loss,), {})
    big.add_(1)
    with pytest.raises(bundle.NoBundle, match="changed a \\(131072,\\) tensor in place"):
        bundle.script_state({"tapes": [tape], "update": None, "model": {}, "optimizer": {}}, model, None, None)


def test_a_view_of_a_large_storage_is_kept_alone():
    dataset = torch.arange(1 << 20, dtype=torch.float32)
    tape = Tape(externals=[(dataset[10:20], dataset._version)])
    kept, _ = tape.portable().externals[0]
    assert kept.untyped_storage().nbytes() == 40 and torch.equal(kept, dataset[10:20])


def test_the_scripts_own_modules_go_by_value_and_libraries_by_name(tmp_path, monkeypatch):
    (tmp_path / "my_model_helpers.py").write_text("def double(x):\n    return 2 * x\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_model_helpers

    try:
        own = bundle._own_modules()
        assert "my_model_helpers" in own
        assert not {"torch", "numpy", "click", "json", "debug_nan"} & set(own)
        with bundle.script_modules_by_value():
            data = _dumps(bundle.pickle_module(), my_model_helpers.double)
        del sys.modules["my_model_helpers"]  # the module is gone where the bundle replays
        assert pickle.loads(data)(torch.tensor(3)).item() == 6
    finally:
        sys.modules.pop("my_model_helpers", None)


@pytest.mark.skipif(not torch_support.save_options(), reason="only torch < 2.6 on Python 3.13")
def test_a_bundle_is_refused_where_torch_save_takes_no_pickler():
    with pytest.raises(bundle.NoBundle, match="torch 2.6 lifts this"):
        bundle.pickle_module()
