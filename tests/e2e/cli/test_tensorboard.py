"""--tensorboard DIR through the CLI: a finding and the fp16 loss scale, read back with TensorBoard's own
reader."""

import pytest

from tests.conftest import SCENARIOS
from tests.support.tensorboard import read_back, values

pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def test_a_finding_and_the_fp16_loss_scale_through_the_cli(run_cli, tmp_path):
    run = run_cli("--task", f"{SCENARIOS}:high_lr", "--lr", "3", "--max-steps", "10", "--device", "cpu",
                  "--precision", "fp16", "--tensorboard", str(tmp_path / "tb"))
    assert run.code == 1 and run.first["cause"] == "overflow", run.output  # fp16's range, with --lr 3
    assert "TensorBoard events written to" in run.output
    acc = read_back(tmp_path / "tb")
    steps = run.report["history"]
    assert [s for s, _ in values(acc, "loss")] == [h["step"] for h in steps]
    assert [v for _, v in values(acc, "loss_scale")] == [h["loss_scale"] for h in steps]
    assert steps[0]["loss_scale"] == 65536.0
    finding = acc.Tensors("finding/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "cause        overflow" in finding and f"where        step {run.first['step']}," in finding
