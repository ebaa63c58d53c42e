"""--tensorboard DIR: the history as scalars, NaN written as it was, the folder checked; read back with
TensorBoard's own reader."""

import math

import pytest

from debug_nan.errors import InputError
from debug_nan.presentation.tensorboard import check_tensorboard, write_tensorboard
from tests.support.tensorboard import read_back, values
from tests.unit.presentation.test_history_table import deep_history

pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def test_history_written_as_scalars_per_layer(tmp_path):
    history, model = deep_history(3, grow_block=4)
    for rec in history.steps:
        rec.loss, rec.lr, rec.parts = 2.0 + rec.step, 1e-3 * rec.step, {"mse": 0.5}
    path = write_tensorboard(str(tmp_path / "tb"), history, model, {"status": "clean, 3 step(s) run"})
    assert path.startswith(str(tmp_path / "tb" / "events.out.tfevents."))
    assert [p.name for p in (tmp_path / "tb").iterdir()] == [path.rsplit("/", 1)[1]]  # no staging folder left
    acc = read_back(tmp_path / "tb")
    tags = acc.Tags()["scalars"]
    assert values(acc, "loss") == [(1, 3.0), (2, 4.0), (3, 5.0)]
    assert values(acc, "loss_part/mse") == [(1, 0.5), (2, 0.5), (3, 0.5)]
    assert [round(v, 6) for _, v in values(acc, "lr")] == [0.001, 0.002, 0.003]
    assert [v for _, v in values(acc, "max_abs_activation/layers.4.mlp.up_proj")] == pytest.approx([20, 200, 2000])
    assert values(acc, "grad_norm/layers.4.mlp.up_proj")[0][1] == pytest.approx(0.5)
    assert len([t for t in tags if t.startswith("grad_norm/layers.")]) == 32 * 9
    assert "loss_scale" not in tags  # fp32: no scaler
    text = acc.Tensors("status/text_summary")[0].tensor_proto.string_val[0].decode()
    assert text == "clean, 3 step(s) run"


def test_nan_values_are_written_as_they_were(tmp_path):
    history, model = deep_history(2, nan_from=30)
    write_tensorboard(str(tmp_path), history, model, {})
    acc = read_back(tmp_path)
    last = values(acc, "max_abs_activation/layers.31.mlp.down_proj")
    assert last[0] == (1, 2.0) and last[1][0] == 2 and math.isnan(last[1][1])


def test_tensorboard_folder_must_be_a_folder(tmp_path):
    file = tmp_path / "tb"
    file.write_text("not a folder")
    with pytest.raises(InputError, match=r"--tensorboard .*tb is a file; give a folder"):
        check_tensorboard(str(file))
    check_tensorboard(str(tmp_path / "new" / "tb"))
    assert (tmp_path / "new" / "tb").is_dir()
