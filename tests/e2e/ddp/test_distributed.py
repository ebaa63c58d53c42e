"""torchrun with 2 CPU processes (gloo): a poison on rank 1 only stops both ranks promptly, at the same point; a
rank that fails alone never leaves the other waiting (a hang fails the test at torchrun's timeout, 180 s: the
collectives' own is 300 s)."""

import json
import re
import socket
import subprocess
import sys

import pytest

from tests.conftest import SCENARIOS, TINY
from tests.support import FAULT_TASKS


def torchrun(*args: str, cwd, timeout: int = 180) -> subprocess.CompletedProcess:
    """`torchrun --nproc_per_node=2 -m debug_nan ARGS`; a job that has not ended after `timeout` s fails the test."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                           f"--master_port={port}", "--master_addr=127.0.0.1", "-m", "debug_nan", *args],
                          cwd=cwd, capture_output=True, text=True, timeout=timeout)


def rank_exit_codes(proc) -> dict[str, str]:
    """Each worker's exit code, from torchrun's failure summary."""
    return dict(re.findall(r"rank\s*:\s*(\d+) \(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)", proc.stderr))


def test_poison_on_rank_1_stops_both_ranks_and_names_rank_1(tmp_path):
    proc = torchrun("--task", f"{SCENARIOS}:ddp_poisoned_rank1", "--device", "cpu", "--max-steps", "4",
                             "--report", "r.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert rank_exit_codes(proc) == {"0": "1", "1": "1"}, proc.stderr  # both processes exited 1
    report = json.loads((tmp_path / "r.json").read_text())
    f = report["first_nonfinite"]
    assert (f["rank"], f["first_ranks"], f["step"], f["micro_step"]) == (1, [1], 2, 1)
    assert (f["phase"], f["module"], f["cause"]) == ("forward", "attn", "all_masked_softmax")
    assert report["steps_run"] == 2
    assert "rank 1 (first to see it: rank(s) 1)" in proc.stdout
    rank1 = (tmp_path / "debug-nan-rank1.log").read_text()
    assert "cause        all_masked_softmax" in rank1
    assert (tmp_path / "debug-nan-bundle-step2-micro1.pt").is_file()  # written by the pinpointing rank


@pytest.fixture(scope="session")
def clean_run(tmp_path_factory):
    """A healthy job on 2 ranks (3 steps, accumulation 2), once: what the tests below read from it (session-scoped:
    a module's fixture is set up again whenever pytest-xdist runs another module's test in between)."""
    folder = tmp_path_factory.mktemp("clean_run")
    proc = torchrun("--task", f"{SCENARIOS}:healthy_masks", "--device", "cpu", "--max-steps", "3",
                    "--gradient-accumulation-steps", "2", "--report", "r.json", cwd=folder)
    return proc, folder


@pytest.mark.xdist_group("ddp_clean_run")  # (one worker: the run is made once)
def test_clean_two_process_run_exits_0(clean_run):
    proc, folder = clean_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((folder / "r.json").read_text())
    assert report["status"] == "clean" and report["steps_run"] == 3


def test_builtin_pipeline_under_torchrun_shards_samples(tmp_path):
    proc = torchrun("--config", TINY, "--device", "cpu", "--max-steps", "2", "--gradient-accumulation-steps",
                       "2", "--report", "r.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0 of 2" in proc.stdout
    rank1 = (tmp_path / "debug-nan-rank1.log").read_text()
    assert "rank 1 of 2" in rank1 and "CLEAN" in rank1


def test_loss_raising_on_one_rank_does_not_hang_the_other(tmp_path):
    proc = torchrun("--task", f"{SCENARIOS}:ddp_raises_on_rank1", "--device", "cpu", "--max-steps", "4",
                             "--report", "r.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    f = json.loads((tmp_path / "r.json").read_text())["first_nonfinite"]
    assert (f["rank"], f["step"], f["cause"]) == (1, 2, "all_masked_softmax")
    assert f["exception"].startswith("ValueError: NaN values found")


def test_fewer_micro_batches_than_ranks(tmp_path):
    proc = torchrun("--task", f"{SCENARIOS}:ddp_one_batch", "--device", "cpu", "--max-steps", "2",
                       "--report", "r.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["steps_run"] == 2


def test_loss_raising_before_the_model_runs_on_one_rank(tmp_path):
    proc = torchrun("--task", f"{SCENARIOS}:ddp_raises_before_forward", "--device", "cpu",
                             "--max-steps", "4", "--report", "r.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "error" and report["first_nonfinite"] is None
    assert "KeyError" in report["error"] and "step 2, micro-batch 1" in report["error"]


def test_bad_input_on_one_rank_stops_every_rank_with_exit_2(tmp_path):
    proc = torchrun("--task", f"{SCENARIOS}:one_shot_generator", "--device", "cpu", "--max-steps", "4",
                             "--report", "r.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # torchrun itself exits 1 whenever a worker fails
    assert rank_exit_codes(proc) == {"0": "2", "1": "2"}, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "error" and report["exit_code"] == 2
    assert "one-shot generator" in report["error"]


def test_optimizer_phase_replay_uses_the_averaged_gradients(tmp_path):
    proc = torchrun("--task", f"{SCENARIOS}:ddp_optimizer_overflow", "--device", "cpu", "--max-steps", "2",
                       "--max-grad-norm", "0", "--report", "r.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    f = json.loads((tmp_path / "r.json").read_text())["first_nonfinite"]
    assert (f["step"], f["phase"], f["cause"]) == (1, "optimizer", "nonfinite_parameter")
    assert f["op"] is not None and "weight" in f["explanation"]


def test_backward_raising_half_way_on_one_rank_does_not_hang_the_other(tmp_path):
    proc = torchrun("--task", f"{SCENARIOS}:ddp_backward_raises", "--device", "cpu", "--max-steps", "4",
                             "--report", "r.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert rank_exit_codes(proc) == {"0": "1", "1": "1"}, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "error" and report["steps_run"] == 1  # step 1 finished, step 2 stopped
    assert "custom backward kernel failed" in report["error"] and "step 2, micro-batch 1" in report["error"]


def test_trainer_failing_to_build_on_one_rank_stops_every_rank_with_its_message(tmp_path):
    proc = torchrun("--task", f"{SCENARIOS}:ddp_optimizer_fails_on_rank1", "--device", "cpu",
                             "--max-steps", "2", "--report", "r.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # torchrun itself exits 1 whenever a worker fails
    assert rank_exit_codes(proc) == {"0": "2", "1": "2"}, proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "error" and report["exit_code"] == 2
    assert report["error"].startswith("rank 1 could not set up the run") and "apex" in report["error"]
    assert "Traceback" not in proc.stdout


@pytest.mark.xdist_group("ddp_clean_run")  # (one worker: the run is made once)
def test_the_header_says_how_gradients_are_averaged(clean_run):
    proc, _ = clean_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gradients averaged by 1 bucket(s) of <= 25 MiB, all-reduced during the backward" in proc.stdout


def test_task_failing_on_one_rank_under_torchrun_goes_through_the_agreement(tmp_path):
    """Rank 1's factory raises: both ranks exit 2 together and rank 0 writes the error report naming rank 1."""
    (tmp_path / "faults.py").write_text(FAULT_TASKS)
    proc = torchrun("--task", "faults.py:fails_on_rank_1", "--device", "cpu", "--report", "r.json", cwd=tmp_path)
    assert proc.returncode != 0, proc.stdout + proc.stderr  # torchrun's own code is 1
    assert rank_exit_codes(proc) == {"0": "2", "1": "2"}, proc.stderr  # both workers exited 2, none was killed
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["exit_code"] == 2 and "rank 1 could not set up the run" in report["error"]
    assert "ValueError: rank 1 cannot open its shard" in report["error"]
