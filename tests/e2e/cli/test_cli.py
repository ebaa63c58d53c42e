"""The command line end to end (issue: foundation)."""

import json

import pytest
from click.testing import CliRunner

from debug_nan.aam.data.writing import write_biom, write_tree
from debug_nan.app.cli import main
from tests.conftest import REPO, TINY, run_process


def test_help_lists_the_flags():
    out = CliRunner().invoke(main, ["--help"]).output
    for flag in ("--token-limit", "--batch-size", "--gradient-accumulation-steps", "--data-dir", "--device",
                 "--max-steps", "--config", "--table", "--tree", "--seed", "--lr", "--precision", "--max-grad-norm",
                 "--guards / --no-guards", "--report", "--log", "--task", "--sequences", "--rarefy-depth"):
        assert flag in out, flag


def test_tiny_synthetic_run_is_clean(run_cli):
    run = run_cli("--config", TINY, "--max-steps", "3", "--device", "cpu")
    assert run.code == 0, run.output
    assert run.report["status"] == "clean" and run.report["steps_run"] == 3
    assert run.report["first_nonfinite"] is None
    assert "synthesized 24 samples" in run.output and "CLEAN" in run.output
    losses = [h["loss"] for h in run.report["history"]]
    assert all(loss > 0 for loss in losses) and len(losses) == 3


def test_no_guards_reproduces_the_padding_nan(run_cli):
    run = run_cli("--config", TINY, "--max-steps", "3", "--device", "cpu", "--no-guards")
    assert run.code == 1, run.output
    assert run.report["status"] == "nonfinite"
    first = run.first
    assert (first["step"], first["micro_step"], first["phase"]) == (1, 1, "forward")
    assert first["module"] == "asv_encoder.transformer.layers.0.attn"
    assert first["op"] == "aten._softmax.default" and first["cause"] == "all_masked_softmax"
    assert first["kind"] == "nan" and first["source"].startswith("debug_nan/aam/model/attention.py:")
    assert "all padding" in first["explanation"] and "ASV slots" in first["explanation"]


def test_flags_override_the_config_and_log_copy(run_cli, tmp_path):
    run = run_cli("--config", TINY, "--max-steps", "1", "--device", "cpu", "--batch-size", "2", "--log",
                  str(tmp_path / "copy.log"))
    assert run.code == 0
    assert run.report["settings"]["batch_size"] == 2 and run.report["settings"]["d_model"] == 32
    text = (tmp_path / "copy.log").read_text()
    assert "tokens [2, 24, 151]" in text and "SUMMARY" in text


def test_biom_and_tree_written_by_a_test(run_cli, tiny_data, tmp_path):
    data_dir = tmp_path / "mydata"
    data_dir.mkdir()
    write_biom(tiny_data, data_dir / "table.biom", "json")
    write_tree(tiny_data, data_dir / "tree.nwk")
    before = (data_dir / "table.biom").read_bytes()
    run = run_cli("--config", TINY, "--data-dir", str(data_dir), "--max-steps", "2", "--device", "cpu")
    assert run.code == 0, run.output
    assert f"Loaded BIOM table {data_dir / 'table.biom'}: 24 samples x 72 ASVs" in run.output
    assert "UniFrac (unweighted" in run.output
    assert (data_dir / "table.biom").read_bytes() == before  # inputs are never modified
    assert list(data_dir.iterdir()) and not list(data_dir.glob("*.npy"))


@pytest.mark.processes
def test_shipped_demo_data_in_a_fresh_process(tmp_path):
    proc = run_process("--config", TINY, "--data-dir", str(REPO / "data"), "--max-steps", "2", "--device", "cpu",
                       "--unifrac", "weighted", "--report", "r.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "demo.biom: 40 samples x 384 ASVs" in proc.stdout
    assert json.loads((tmp_path / "r.json").read_text())["status"] == "clean"


def test_cuda_requested_without_cuda_is_exit_2(run_cli):
    import torch

    if torch.cuda.is_available():
        return
    run = run_cli("--config", TINY, "--device", "cuda")
    assert run.code == 2 and "no usable CUDA device" in run.output


def test_auto_device_notice_on_cpu(run_cli):
    import torch

    run = run_cli("--config", TINY, "--max-steps", "1")
    assert run.code == 0
    if not torch.cuda.is_available():
        assert "NOTICE: no CUDA device is available; running on the CPU" in run.output


def test_mixed_precision_runs_are_clean(run_cli):
    for precision in ("bf16", "fp16"):
        run = run_cli("--config", TINY, "--max-steps", "2", "--device", "cpu", "--precision", precision)
        assert run.code == 0, run.output
        assert run.report["settings"]["precision"] == precision and run.report["status"] == "clean"
        assert run.report["steps_run"] == 2


def test_mixed_precision_without_guards_finds_the_padding_nan(run_cli):
    """The main job's bf16 and fp16 runs on the CPU (scripts/gpu_check.py runs them on CUDA)."""
    for precision in ("bf16", "fp16"):
        run = run_cli("--config", TINY, "--max-steps", "2", "--device", "cpu", "--precision", precision,
                      "--no-guards")
        assert run.code == 1, run.output
        first = run.first
        assert (first["phase"], first["cause"]) == ("forward", "all_masked_softmax")
        assert run.report["settings"]["precision"] == precision
