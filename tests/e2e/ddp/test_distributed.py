"""The CLI on 2 CPU ranks (gloo): a poison on rank 1 only stops both ranks promptly, at the same point; a rank that
fails alone never leaves the other waiting. Under torchrun, the healthy built-in pipeline and the poison (the way the
README launches it); every other case with its 2 ranks started by hand (test_run_ddp.py's `ranks`: torchrun is not
what they test, its launcher is a process more per job, and each rank's own exit code is then read, not torchrun's
summary of it)."""

import json
import re
import subprocess
import sys
import time

import pytest

from debug_nan import torch_support
from tests.conftest import SCENARIOS, TINY
from tests.e2e.ddp.test_run_ddp import joined, ranks
from tests.support.once import once
from tests.support.ports import reserved_port


def torchrun(*args: str, cwd, timeout: int = 180) -> tuple[subprocess.CompletedProcess, float]:
    """A 2-rank torchrun job. A rank left waiting in a collective fails the test by the timeout (a collective's own
    timeout is minutes longer); no test asserts how fast a job ran, which a loaded machine decides."""
    with reserved_port() as port:  # (tests/support/ports.py: no concurrent job can be given it)
        start = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
                               f"--master_port={port}", "--master_addr=127.0.0.1", "-m", "debug_nan", *args],
                              cwd=cwd, capture_output=True, text=True, timeout=timeout)
        return proc, time.perf_counter() - start


def rank_exit_codes(proc) -> dict[str, str]:
    """Each worker's exit code, from torchrun's failure summary."""
    return dict(re.findall(r"rank\s*:\s*(\d+) \(local_rank.*?\n\s*exitcode\s*:\s*(-?\d+)", proc.stderr))


def assert_every_rank_exited(proc, code: str) -> None:
    """Every rank exited with `code`, none was killed, as torchrun's failure summary says. A torchrun that lists the
    workers it stopped lists both ranks; an older one (torch_support.torchrun_records_terminated_workers: torch 2.4,
    2.5) lists only those it saw exit at the poll that saw the first failure, and stops the others, which then exit
    with the same code (leave_together) without being listed."""
    codes = rank_exit_codes(proc)
    if torch_support.torchrun_records_terminated_workers():
        assert codes == {"0": code, "1": code}, proc.stderr
    else:
        assert codes and set(codes) <= {"0", "1"} and set(codes.values()) == {code}, proc.stderr


def test_poison_on_rank_1_stops_both_ranks_and_names_rank_1(tmp_path):
    proc, seconds = torchrun("--task", f"{SCENARIOS}:ddp_poisoned_rank1", "--device", "cpu", "--max-steps", "4",
                             "--report", "r.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert_every_rank_exited(proc, "1")
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
    """The built-in pipeline (its padding masks deliberate: no finding), healthy on 2 ranks (3 steps, accumulation
    2), once (tests/support/once.py): what the tests below read from it."""
    return once(tmp_path_factory, "ddp-clean-run", lambda folder: torchrun(
        "--config", TINY, "--device", "cpu", "--max-steps", "3", "--gradient-accumulation-steps", "2",
        "--report", "r.json", cwd=folder)[0])


def test_clean_two_process_run_exits_0_and_shards_the_samples(clean_run):
    proc, folder = clean_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((folder / "r.json").read_text())
    assert report["status"] == "clean" and report["steps_run"] == 3
    assert "rank 0 of 2" in proc.stdout
    rank1 = (folder / "debug-nan-rank1.log").read_text()
    assert "rank 1 of 2" in rank1 and "CLEAN" in rank1


def by_hand(*args: str, cwd) -> subprocess.CompletedProcess:
    """`python -m debug_nan ARGS` as ranks 0 and 1 started by hand -> the job as one process (test_run_ddp.joined)."""
    return joined(ranks(*args, cwd=cwd))


def test_loss_raising_on_one_rank_does_not_hang_the_other(tmp_path):
    proc = by_hand("--task", f"{SCENARIOS}:ddp_raises_on_rank1", "--device", "cpu", "--max-steps", "4",
                             "--report", "r.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    f = json.loads((tmp_path / "r.json").read_text())["first_nonfinite"]
    assert (f["rank"], f["step"], f["cause"]) == (1, 2, "all_masked_softmax")
    assert f["exception"].startswith("ValueError: NaN values found")


def test_fewer_micro_batches_than_ranks(tmp_path):
    proc = by_hand("--task", f"{SCENARIOS}:ddp_one_batch", "--device", "cpu", "--max-steps", "2",
                       "--report", "r.json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert json.loads((tmp_path / "r.json").read_text())["steps_run"] == 2


def test_loss_raising_before_the_model_runs_on_one_rank(tmp_path):
    proc = by_hand("--task", f"{SCENARIOS}:ddp_raises_before_forward", "--device", "cpu",
                             "--max-steps", "4", "--report", "r.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "error" and report["first_nonfinite"] is None
    assert "KeyError" in report["error"] and "step 2, micro-batch 1" in report["error"]


def test_bad_input_on_one_rank_stops_every_rank_with_exit_2(tmp_path):
    proc = by_hand("--task", f"{SCENARIOS}:one_shot_generator", "--device", "cpu", "--max-steps", "4",
                             "--report", "r.json", cwd=tmp_path)
    assert proc.codes == [2, 2], proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "error" and report["exit_code"] == 2
    assert "one-shot generator" in report["error"]


def test_optimizer_phase_replay_uses_the_averaged_gradients(tmp_path):
    proc = by_hand("--task", f"{SCENARIOS}:ddp_optimizer_overflow", "--device", "cpu", "--max-steps", "2",
                       "--max-grad-norm", "0", "--report", "r.json", cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    f = json.loads((tmp_path / "r.json").read_text())["first_nonfinite"]
    assert (f["step"], f["phase"], f["cause"]) == (1, "optimizer", "nonfinite_parameter")
    assert f["op"] is not None and "weight" in f["explanation"]


def test_backward_raising_half_way_on_one_rank_does_not_hang_the_other(tmp_path):
    proc = by_hand("--task", f"{SCENARIOS}:ddp_backward_raises", "--device", "cpu", "--max-steps", "4",
                             "--report", "r.json", cwd=tmp_path)
    assert proc.codes == [1, 1], proc.stdout + proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "error" and report["steps_run"] == 1  # step 1 finished, step 2 stopped
    assert "custom backward kernel failed" in report["error"] and "step 2, micro-batch 1" in report["error"]


def test_trainer_failing_to_build_on_one_rank_stops_every_rank_with_its_message(tmp_path):
    """Rank 1 cannot set up (its optimizer asks for apex; a task's factory raising on one rank takes the same way):
    every rank goes through the agreement and exits 2 together, rank 0's report names rank 1."""
    proc = by_hand("--task", f"{SCENARIOS}:ddp_optimizer_fails_on_rank1", "--device", "cpu",
                             "--max-steps", "2", "--report", "r.json", cwd=tmp_path)
    assert proc.codes == [2, 2], proc.stderr
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["status"] == "error" and report["exit_code"] == 2
    assert report["error"].startswith("rank 1 could not set up the run") and "apex" in report["error"]
    assert "Traceback" not in proc.stdout


def test_the_header_says_how_gradients_are_averaged(clean_run):
    proc, _ = clean_run
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "gradients averaged by 1 bucket(s) of <= 25 MiB, all-reduced during the backward" in proc.stdout
