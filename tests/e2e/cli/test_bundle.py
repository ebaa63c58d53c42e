"""Repro bundles: a --no-guards run writes one; `debug-nan replay` reaches the same finding in a fresh process."""

import json

import pytest

from tests.conftest import SCENARIOS, TINY, run_process


@pytest.mark.processes
def test_no_guards_bundle_replays_to_the_same_finding_in_a_fresh_process(run_cli, tmp_path):
    run = run_cli("--config", TINY, "--device", "cpu", "--no-guards", "--max-steps", "2")
    assert run.code == 1
    bundle = run.first["bundle"]
    assert bundle and bundle.endswith("debug-nan-bundle-step1-micro1.pt")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()  # no data, no synthetic dataset: the bundle alone must do
    proc = run_process("replay", bundle, "--device", "cpu", "--report", "replay.json", cwd=elsewhere)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    again = json.loads((elsewhere / "replay.json").read_text())["first_nonfinite"]
    for key in ("step", "micro_step", "phase", "module", "op", "cause", "kind", "source"):
        assert again[key] == run.first[key], key
    assert "Same origin as recorded in the bundle." in proc.stdout
    # the built-in task's bundle holds no object of a script: it loads with weights_only=True
    import io

    import torch

    from tests.support.bundles import payload

    assert b'"code": false' in open(bundle, "rb").read(200)
    assert torch.load(io.BytesIO(payload(bundle)), weights_only=True)["step"] == 1


def test_task_bundle_replays_through_the_task_reference(run_cli, tmp_path):
    run = run_cli("--task", f"{SCENARIOS}:accumulation", "--gradient-accumulation-steps", "4", "--device", "cpu")
    assert (run.first["step"], run.first["micro_step"]) == (2, 3)
    from click.testing import CliRunner

    from debug_nan.app.cli import main

    out = CliRunner().invoke(main, ["replay", run.first["bundle"], "--report", str(tmp_path / "r.json")])
    assert out.exit_code == 1, out.output
    again = json.loads((tmp_path / "r.json").read_text())["first_nonfinite"]
    assert (again["step"], again["micro_step"], again["cause"]) == (2, 3, "all_masked_softmax")


def test_optimizer_phase_bundle(run_cli, tmp_path):
    run = run_cli("--task", f"{SCENARIOS}:adam_eps_zero", "--device", "cpu")
    from click.testing import CliRunner

    from debug_nan.app.cli import main

    out = CliRunner().invoke(main, ["replay", run.first["bundle"], "--report", str(tmp_path / "r.json")])
    again = json.loads((tmp_path / "r.json").read_text())["first_nonfinite"]
    assert out.exit_code == 1 and (again["phase"], again["cause"]) == ("optimizer", "nonfinite_parameter")


def test_not_a_bundle_is_exit_2(tmp_path):
    from click.testing import CliRunner

    from debug_nan.app.cli import main

    junk = tmp_path / "junk.pt"
    junk.write_text("nope")
    out = CliRunner().invoke(main, ["replay", str(junk)])
    assert out.exit_code == 2 and "carries no debug-nan signature" in out.output
    out = CliRunner().invoke(main, ["replay", str(junk), "--trust"])
    assert out.exit_code == 2 and "is not a debug-nan repro bundle" in out.output


def test_task_bundle_replays_where_the_task_file_is_gone(tmp_path, monkeypatch):
    """The bundle carries the task file's text: replay from another folder after the file was deleted."""
    import shutil

    from click.testing import CliRunner

    from debug_nan.app.cli import main

    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(SCENARIOS, work / "my_task.py")
    monkeypatch.chdir(work)
    CliRunner().invoke(main, ["--task", "my_task.py:masked_softmax", "--device", "cpu", "--report", "r.json"])
    bundle = work / "debug-nan-bundle-step1-micro1.pt"
    (work / "my_task.py").unlink()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    out = CliRunner().invoke(main, ["replay", str(bundle), "--report", "again.json"])
    assert out.exit_code == 1, out.output
    again = json.loads((elsewhere / "again.json").read_text())["first_nonfinite"]
    assert (again["cause"], again["module"]) == ("all_masked_softmax", "attn")
