"""`torchrun --nproc_per_node=2 -m debug_nan run -- ddp_script.py`: an unmodified DDP script (gloo, CPU) watched on
every rank. Healthy: its output byte for byte, its exit code on every rank. Broken: the ranks agree, each that saw
the harm first replays its own micro-batch in place (no second run, no new rendezvous), they stop together with
exit 1, and the finding names the rank that saw the harm first: the same as the CLI's `--task` under torchrun for
the same model and batches (tests/support/run/tasks.py; the script deals batch i to rank i % 2, as the CLI does). A rank
that fails alone never leaves the others waiting."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO, SUPPORT
from tests.support.ports import reserved_port

HERE = SUPPORT / "run"
SCRIPT = str(HERE / "ddp_script.py")
FIELDS = ("step", "micro_step", "phase", "module", "module_type", "op", "cause", "kind", "source", "rank")


def env() -> dict:
    """The ranks' environment: the repository importable (tasks.py imports `tests.support.models`), as in pytest."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", PYTHONPATH=path)


def torchrun(*args: str, cwd: Path, timeout: int = 240, nproc: int = 2) -> subprocess.CompletedProcess:
    """`torchrun --standalone --nproc_per_node=NPROC ARGS` in `cwd`, its ranks in the environment above."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", *args]
    return subprocess.run(command, cwd=cwd, env=env(), capture_output=True, text=True, timeout=timeout)


def ranks(*args: str, cwd: Path) -> list[subprocess.CompletedProcess]:
    """`python -m debug_nan ARGS` as ranks 0 and 1 of a 2-process job started by hand (not torchrun): each rank's
    own exit code and output. Every rank must end on its own (a rank left waiting fails the test at 240 s)."""
    with reserved_port() as port:  # (tests/support/ports.py: no concurrent job can be given it)
        return _ranks(args, cwd, port)


def _ranks(args, cwd: Path, port: int) -> list[subprocess.CompletedProcess]:
    procs = [subprocess.Popen([sys.executable, "-m", "debug_nan", *args], cwd=cwd, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env=dict(env(), RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)))
             for r in range(2)]
    done = []
    try:
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=240)
            done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return done


def joined(done: list[subprocess.CompletedProcess]) -> subprocess.CompletedProcess:
    """The ranks' processes as one job's, as a launcher's: the first non-zero exit code (else 0), the ranks' stdout
    and stderr one after the other, rank 0's first; each rank's own code in `.codes`."""
    code = next((d.returncode for d in done if d.returncode != 0), 0)
    job = subprocess.CompletedProcess([d.args for d in done], code, "".join(d.stdout for d in done),
                                      "".join(d.stderr for d in done))
    job.codes = [d.returncode for d in done]
    return job


def watched(tmp_path, *args: str) -> tuple[list[subprocess.CompletedProcess], dict]:
    report = tmp_path / "run.json"
    done = ranks("run", "--report", str(report), "--", SCRIPT, *args, cwd=tmp_path)
    return done, json.loads(report.read_text())


def plain_torchrun(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    """The script under torchrun without debug-nan. Its ranks can die at interpreter exit with SIGABRT ("terminate
    called without an active exception": a gloo worker thread frees the last tensor of a collective while Python
    finalizes, about 1 run in 20 on a loaded 2-core machine): that torch teardown race is retried, up to 3 runs."""
    for _ in range(3):
        done = torchrun(*args, cwd=cwd)
        if done.returncode == 0 or "SIGABRT" not in done.stderr:
            return done
    return done


def test_healthy_ddp_script_prints_exactly_its_own_output_under_torchrun(tmp_path):
    alone = plain_torchrun(SCRIPT, cwd=tmp_path)
    report = tmp_path / "run.json"
    log = tmp_path / "log.txt"  # (--log-file: torchrun's own parser takes --log for its --log-dir)
    done = torchrun("-m", "debug_nan", "run", "--report", str(report), "--log-file", str(log), "--", SCRIPT,
                    cwd=tmp_path)
    assert alone.returncode == 0 and done.returncode == 0, done.stderr
    assert "CLEAN: 4 step(s)" in log.read_text()
    assert done.stdout == alone.stdout and alone.stdout.count("\n") == 4
    data = json.loads(report.read_text())
    assert (data["status"], data["steps_run"], data["exit_code"], data["integration"]["world_size"]) == (
        "clean", 4, 0, 2)
    assert "[debug-nan] torchrun: 2 ranks" in done.stderr and done.stderr.count("[debug-nan] watching Net") == 1
    assert "terminate called" not in done.stderr


def test_healthy_ranks_exit_with_the_script_own_code(tmp_path):
    done, data = watched(tmp_path, "--exit-code", "3")
    assert [d.returncode for d in done] == [3, 3], done[1].stderr
    assert done[0].stdout.count("\n") == 4 and done[1].stdout == ""
    assert "debug-nan" not in done[1].stderr and "SUMMARY" in done[0].stderr  # rank 0 alone speaks
    assert (data["status"], data["exit_code"]) == ("clean", 3)


# What the CLI's `--task tests/support/run/tasks.py:<task>` gives under torchrun for the same model and batches
# (torchrun -m debug_nan --task ... --device cpu --max-steps 4; its CLI runs are tests/e2e/ddp/test_distributed.py's
# and test_fsdp_cli.py's, a torchrun job each is CI time): `run` of the script must give the same
CLI_FINDINGS = {
    "masked": dict(step=2, micro_step=1, phase="forward", module="attn", module_type="MaskedAttention",
                   op="aten._softmax.default", cause="all_masked_softmax", kind="nan",
                   source="tests/support/models.py:35", rank=1),
    "overflow": dict(step=3, micro_step=1, phase="loss", module="", module_type="", op="aten.pow.Tensor_Scalar",
                     cause="overflow", kind="inf", source="tests/support/models.py:80", rank=0)}


@pytest.mark.parametrize("bug, first_ranks, noise", [
    # a sample with no valid key, in rank 1's batch of step 2 only; rank 1 adds noise from the OS to its batches:
    # a second run would differ, the in-place replay from the run's own state does not (the same finding)
    ("masked", [1], ("--noise-on-rank1",)),
    ("overflow", [0, 1], ()),  # targets ~1e20 on both ranks at step 3
])
def test_nan_on_some_ranks_is_traced_on_the_rank_that_saw_it_first(tmp_path, bug, first_ranks, noise):
    done, data = watched(tmp_path, "--bug", bug, *noise)
    assert [d.returncode for d in done] == [1, 1], done[0].stderr
    first = data["first_nonfinite"]
    assert first["first_ranks"] == first_ranks and first["rank"] == first_ranks[0]
    assert not list(tmp_path.glob("run.rank*.json"))  # rank 0 alone writes the report
    assert "[ddp] trip seen by rank(s)" in done[0].stderr and "debug-nan" not in done[1].stderr
    assert f"rank {first_ranks[0]} (first to see it: rank(s) {', '.join(map(str, first_ranks))})" in done[0].stderr
    assert {k: first[k] for k in FIELDS} == CLI_FINDINGS[bug]


def test_a_nan_born_in_rank_1s_backward_is_rank_1s_though_every_rank_saw_it_first(tmp_path):
    """DDP's all-reduce inside the backward brings rank 1's NaN gradient to rank 0: both trip in the backward. Rank
    0's replay finds its gradients non-finite with no op of its own that made them; rank 1's names the op."""
    done, data = watched(tmp_path, "--bug", "zero-norm")
    assert [d.returncode for d in done] == [1, 1], done[0].stderr
    first = data["first_nonfinite"]
    assert (first["step"], first["phase"], first["rank"], first["first_ranks"]) == (2, "backward", 1, [0, 1])
    assert (first["op"], first["backward_node"], first["cause"]) == (
        "aten.div.Tensor", "SqrtBackward0", "grad_at_singularity")


def test_a_nan_in_rank_1s_batch_is_a_data_finding_without_a_replay(tmp_path):
    done, data = watched(tmp_path, "--bug", "nan-batch")
    assert [d.returncode for d in done] == [1, 1], done[0].stderr
    first = data["first_nonfinite"]
    assert (first["step"], first["phase"], first["cause"], first["rank"], first["first_ranks"]) == (
        2, "data", "nonfinite_input", 1, [1])
    assert "positions [[3, 0, 0]]" in first["explanation"] and "[pinpoint] replaying" not in done[0].stderr


def test_lr_explosion_on_both_ranks_stops_every_rank_at_the_same_step(tmp_path):
    done, data = watched(tmp_path, "--bug", "lr")
    assert [d.returncode for d in done] == [1, 1], done[0].stderr
    first = data["first_nonfinite"]
    assert (first["step"], first["cause"], first["module"], first["detected_by"]) == (
        2, "gradient_explosion", "head", "gradient history")
    # the script's step 2 print never came: stopped before (the loss as a number: its last digits are the CPU's)
    printed = done[0].stdout.split()
    assert printed[:3] == ["step", "1", "loss"] and len(printed) == 4 and done[0].stdout.count("\n") == 1
    assert math.isclose(float(printed[3]), 1.081624, rel_tol=1e-3)


@pytest.mark.parametrize("steps", ["4", "2"])  # 2: the last update, checked after the script destroyed its group
def test_a_nan_learning_rate_on_every_rank_is_traced_in_the_optimizer_step(tmp_path, steps):
    done, data = watched(tmp_path, "--bug", "nan-lr", "--steps", steps)
    assert [d.returncode for d in done] == [1, 1], done[0].stderr
    first = data["first_nonfinite"]
    assert (first["step"], first["phase"], first["op"], first["cause"], first["rank"], first["first_ranks"]) == (
        2, "optimizer", "aten.mul_.Tensor", "nonfinite_parameter", 0, [0, 1])
    line = Path(SCRIPT).read_text().splitlines().index("    optimizer.step()") + 1
    assert first["source"] == f"tests/support/run/ddp_script.py:{line}"
    assert "The learning rate is nan" in first["explanation"]


def test_a_rank_failing_alone_ends_the_job_under_torchrun(tmp_path):
    done = torchrun("-m", "debug_nan", "run", "--report", str(tmp_path / "run.json"), "--", SCRIPT,
                    "--raise-on-rank1", cwd=tmp_path)
    assert done.returncode != 0
    assert "ValueError: rank 1 cannot read its batch" in done.stderr
    data = json.loads((tmp_path / "run.rank1.json").read_text())
    assert (data["status"], data["first_nonfinite"]) == ("error", None)
    assert "ValueError: rank 1 cannot read its batch" in data["error"]
