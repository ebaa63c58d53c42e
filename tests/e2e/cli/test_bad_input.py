"""Every bad input: a clear one-paragraph message naming the file/sample/option, exit 2, never a traceback, never
a changed input file."""

import hashlib

import pytest

from debug_nan.aam.data.writing import write_biom, write_tree
from tests.conftest import SCENARIOS, TINY


@pytest.fixture
def dataset_dir(tiny_data, tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    write_biom(tiny_data, d / "table.biom")
    write_tree(tiny_data, d / "tree.nwk")
    return d


def _assert_exit_2(run, *fragments):
    assert run.code == 2, run.output
    for fragment in fragments:
        assert fragment in run.output, (fragment, run.output)
    assert "Traceback" not in run.output
    assert run.output.count("debug-nan: error:") == 1


def _renamed(data, rename):
    import copy

    out = copy.copy(data)
    out.asv_ids = [rename(i) for i in data.asv_ids]
    tree = data.tree.copy()
    for tip in tree.tips():
        tip.name = rename(tip.name)
    out.tree = tree
    return out


def test_missing_biom(run_cli, tmp_path):
    _assert_exit_2(run_cli("--config", TINY, "--table", str(tmp_path / "nope.biom")), "nope.biom does not exist")


def test_corrupt_biom(run_cli, dataset_dir):
    (dataset_dir / "table.biom").write_bytes(b"\x89HDF\r\n\x1a\ncorrupt")
    _assert_exit_2(run_cli("--config", TINY, "--data-dir", str(dataset_dir)), "table.biom could not be read")


def test_tree_missing_table_ids(run_cli, tiny_data, dataset_dir):
    names = [t.name for t in tiny_data.tree.tips()]
    (dataset_dir / "tree.nwk").write_text(str(tiny_data.tree.shear(names[3:])))
    before = (dataset_dir / "tree.nwk").read_bytes()
    run = run_cli("--config", TINY, "--data-dir", str(dataset_dir))
    _assert_exit_2(run, "tree.nwk has no tip for 3 of the 72 observation IDs", "e.g. '")
    assert (dataset_dir / "tree.nwk").read_bytes() == before


def test_hashed_ids_without_sequences(run_cli, tiny_data, tmp_path):
    hashed = _renamed(tiny_data, lambda s: hashlib.md5(s.encode()).hexdigest())
    write_biom(hashed, tmp_path / "h.biom")
    write_tree(hashed, tmp_path / "h.nwk")
    _assert_exit_2(run_cli("--config", TINY, "--table", str(tmp_path / "h.biom"), "--tree", str(tmp_path / "h.nwk")),
                   "h.biom look like hashes", "--sequences FASTA")


def test_empty_table(run_cli, tiny_data, tmp_path):
    import copy

    empty = copy.copy(tiny_data)
    empty.counts = tiny_data.counts * 0
    write_biom(empty, tmp_path / "e.biom")
    write_tree(tiny_data, tmp_path / "e.nwk")
    _assert_exit_2(run_cli("--config", TINY, "--data-dir", str(tmp_path)), "e.biom is empty", "total count 0")


def test_every_sample_empty_after_rarefaction(run_cli, dataset_dir):
    _assert_exit_2(run_cli("--config", TINY, "--data-dir", str(dataset_dir), "--rarefy-depth", "100000000"),
                   "Every sample of", "empty after rarefaction to --rarefy-depth 100000000")


def test_non_dna_characters(run_cli, tiny_data, tmp_path):
    named = _renamed(tiny_data, lambda s: "OTU_" + hashlib.md5(s.encode()).hexdigest()[:6])
    write_biom(named, tmp_path / "o.biom")
    write_tree(named, tmp_path / "o.nwk")
    _assert_exit_2(run_cli("--config", TINY, "--data-dir", str(tmp_path)), "72 ASV sequences of",
                   "contain characters that are not DNA", "'OTU_")


@pytest.mark.parametrize("args, fragment", [
    (["--token-limit", "0"], "--token-limit must be a positive integer, got 0"),
    (["--token-limit", "-5"], "--token-limit must be a positive integer, got -5"),
    (["--batch-size", "100"], "--batch-size 100 is larger than the 24 samples"),
    (["--batch-size", "3"], "--batch-size 3: the UniFrac target needs pairs"),
    (["--precision", "fp8"], "Invalid value for '--precision'"),
    (["--device", "tpu"], "--device 'tpu' is not a device: use auto, cpu, cuda or cuda:N"),
    (["--lr", "nan"], "--lr must be a positive finite number, got nan"),
    (["--max-grad-norm", "-1"], "--max-grad-norm must be a finite number >= 0, got -1.0"),
    (["--explosion-threshold", "-1"], "--explosion-threshold must be a positive finite number"),
    (["--seed", "99999999999999999999"], "--seed must be in 0 .. 2^63 - 1"),
])
def test_bad_options(run_cli, args, fragment):
    run = run_cli("--config", TINY, *args)
    assert run.code == 2 and fragment in run.output and "Traceback" not in run.output


def test_unknown_config_key(run_cli, tmp_path):
    cfg = tmp_path / "c.toml"
    cfg.write_text("[model]\nd_modle = 3\n")
    _assert_exit_2(run_cli("--config", str(cfg)), "c.toml: unknown key `d_modle`")


@pytest.mark.parametrize("option", ["--log", "--report"])
def test_unwritable_output_paths(run_cli, tmp_path, option):
    blocker = tmp_path / "file.txt"
    blocker.write_text("x")
    from click.testing import CliRunner

    from debug_nan.app.cli import main

    out = CliRunner().invoke(main, ["--config", TINY, option, str(blocker / "out")])
    assert out.exit_code == 2 and f"{option} {blocker / 'out'}" in out.output and "cannot write" in out.output


def test_task_returning_the_wrong_object(run_cli):
    _assert_exit_2(run_cli("--task", f"{SCENARIOS}:not_a_task"), "is not a task", "`model` must be a torch.nn.Module",
                   "`batches` must be an iterable", "`loss(model, batch)` must be callable")


def test_task_optimizer_that_is_not_an_optimizer(run_cli):
    _assert_exit_2(run_cli("--task", f"{SCENARIOS}:bad_optimizer"), "optimizer(params) must return a "
                   "torch.optim.Optimizer, got str")


def test_out_of_memory_names_the_size_and_the_option(run_cli):
    _assert_exit_2(run_cli("--task", f"{SCENARIOS}:out_of_memory", "--device", "cpu"),
                   "an allocation of 2.00 GiB failed", "lower the batch size")


def test_ctrl_c_writes_the_partial_summary_and_report(run_cli):
    run = run_cli("--task", f"{SCENARIOS}:interrupted_at_step_2", "--device", "cpu", "--max-steps", "5")
    assert run.code == 130
    assert run.report["interrupted"] is True and run.report["steps_run"] == 1 and run.report["exit_code"] == 130
    assert "Interrupted (Ctrl-C)" in run.output and "SUMMARY" in run.output


def test_one_shot_generator_is_a_clear_error(run_cli):
    run = run_cli("--task", f"{SCENARIOS}:one_shot_generator", "--device", "cpu", "--max-steps", "5")
    _assert_exit_2(run, "ran dry after 3 micro-batches", "not a one-shot generator")


def test_exit_2_leaves_an_error_report_not_an_empty_file(run_cli, tmp_path):
    run = run_cli("--task", "nope.py:f")
    assert run.code == 2 and run.report["status"] == "error" and "does not exist" in run.report["error"]
    assert not list(tmp_path.glob(".debug-nan-probe-*"))


def test_a_folder_given_as_the_task_file_is_named_a_folder(run_cli, tmp_path):
    (tmp_path / "tasks").mkdir()
    _assert_exit_2(run_cli("--task", f"{tmp_path / 'tasks'}:build"), "is a folder: give the .py file in it")
