"""`debug-nan run -- <the command as it is launched>`: a 2-rank DDP job (gloo, CPU) however it starts its ranks:
torchrun, a shell script that calls torchrun, `torch.multiprocessing.spawn`, Lightning's own launcher. Every
process that trains is watched through the start-up hook, the ranks agree over the script's group, and the top
process prints ONE summary after the command ended, naming rank 1 when rank 1 made the value. Each real run is
made once and serves several tests (tests/support/once.py); the plain runs are plain Python and torchrun."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.ddp import test_run_ddp
from tests.support import SUPPORT
from tests.support.once import once
from tests.support.ports import reserved_port
from tests.support.tensorboard import read_back, values

SCRIPT = str(SUPPORT / "run" / "launched.py")
LIGHTNING = str(SUPPORT / "run" / "lightning_launched.py")
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
OVERFLOW = dict(step=3, micro_step=1, op="aten.pow.Tensor_Scalar", cause="overflow", kind="inf",
                source="tests/support/models.py:80", rank=1, first_ranks=[1])
EVAL = dict(step=2, micro_step=1, phase="eval", module="attn", op="aten._softmax.default",
            cause="all_masked_softmax", kind="nan", source="tests/support/models.py:35", rank=1, first_ranks=[1])


def env(**extra) -> dict:
    """The ranks' environment of tests/e2e/ddp/test_run_ddp.py, with EXTRA."""
    return dict(test_run_ddp.env(), **extra)


def run(words: list[str], cwd: Path, **extra) -> subprocess.CompletedProcess:
    return subprocess.run(words, cwd=cwd, env=env(**extra), capture_output=True, text=True, timeout=300)


def watched(*words: str, flags: tuple[str, ...] = (), **extra):
    """make(folder) for once(): `debug-nan run --report run.json FLAGS -- WORDS` in that folder."""
    return lambda folder: run([sys.executable, "-m", "debug_nan", "run", "--report", "run.json", *flags, "--",
                               *words], folder, **extra)


def plain(*words: str, **extra):
    """make(folder) for once(): WORDS alone. A gloo rank can die by SIGABRT at interpreter exit (a torch teardown
    race, test_run_ddp.plain_torchrun): retried, up to 3 runs."""
    def make(folder):
        for _ in range(3):
            done = run(list(words), folder, **extra)
            if done.returncode == 0 or "SIGABRT" not in done.stderr:
                return done
        return done
    return make


def spawned(*args: str):
    def make(folder):
        with reserved_port() as port:
            return run([sys.executable, SCRIPT, "--spawn", str(port), *args], folder)
    return make


def spawned_watched(*args: str):
    def make(folder):
        with reserved_port() as port:
            return watched("python", SCRIPT, "--spawn", str(port), *args)(folder)
    return make


def lightning(make_words):
    def make(folder):
        with reserved_port() as port:  # (Lightning's launcher takes MASTER_PORT when set)
            return make_words(folder, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    return make


def shell_script(folder: Path) -> subprocess.CompletedProcess:
    """A launch script as a cluster job has it, calling `torchrun` by name (a shim on PATH where torch's console
    script is not beside this Python)."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "torchrun"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m torch.distributed.run "$@"\n')
    shim.chmod(0o755)
    script = folder / "train.sh"
    script.write_text(f'#!/bin/bash\nset -e\ntorchrun --standalone --nproc_per_node=2 {SCRIPT} "$@"\n')
    script.chmod(0o755)
    path = f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"
    return watched("./train.sh", "--bug", "overflow", PATH=path)(folder)


def shared(tmp_path_factory, name: str, make) -> tuple[subprocess.CompletedProcess, dict | None]:
    done, folder = once(tmp_path_factory, name, make)
    report = folder / "run.json"
    return done, json.loads(report.read_text()) if report.is_file() else None


def first(report: dict, fields: dict) -> dict:
    return {k: report["first_nonfinite"][k] for k in fields}


def summary(done: subprocess.CompletedProcess) -> str:
    """The one summary block, the last thing debug-nan prints (after any launcher traceback)."""
    assert done.stderr.count("=== SUMMARY ===") == 1, done.stderr
    block = done.stderr[done.stderr.index("=== SUMMARY ==="):]
    assert "Traceback" not in block and "ChildFailedError" not in block
    return " ".join(block.split())


def test_torchrun_healthy_prints_exactly_its_own_output(tmp_path_factory):
    alone, _ = shared(tmp_path_factory, "launched-torchrun-plain", plain(*TORCHRUN, SCRIPT))
    done, report = shared(tmp_path_factory, "launched-torchrun", watched(*TORCHRUN, SCRIPT))
    assert alone.returncode == 0 and done.returncode == 0, done.stderr
    assert done.stdout == alone.stdout and alone.stdout.count("\n") == 4
    assert "CLEAN: 4 step(s)" in summary(done)
    assert (report["status"], report["steps_run"], report["exit_code"]) == ("clean", 4, 0)
    assert (report["integration"]["kind"], report["integration"]["world_size"]) == ("program", 2)
    assert [r["rank"] for r in report["ranks"]] == [0, 1]
    assert done.stderr.count("[debug-nan] watching Net") == 1  # rank 0's lines; rank 1's held back


def test_a_shell_script_calling_torchrun_names_rank_1s_overflow(tmp_path_factory):
    done, report = shared(tmp_path_factory, "launched-shell", shell_script)
    assert done.returncode == 1, done.stderr
    assert first(report, OVERFLOW) == OVERFLOW and report["first_nonfinite"]["phase"] == "loss"
    assert "step 3, micro-batch 1, phase loss, rank 1 (first to see it: rank(s) 1)" in summary(done)
    assert done.stdout.splitlines() == [line for line in done.stdout.splitlines() if line.startswith("step ")]
    assert done.stdout.count("\n") == 2  # both ranks stopped together at step 3
    assert report["exit_code"] == 1 and report["integration"]["exit_code_of_command"] != 0


def test_torchrun_a_nan_only_in_rank_1s_validation_stops_every_rank(tmp_path_factory):
    """With --plot and --tensorboard: the one output pipeline renders, once, the history of the rank that made the
    value (rank 1's, which its report holds): the table before the summary, the heat map, the events."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("tensorboard")
    alone, _ = shared(tmp_path_factory, "launched-torchrun-plain", plain(*TORCHRUN, SCRIPT))
    done, folder = once(tmp_path_factory, "launched-torchrun-eval", watched(
        *TORCHRUN, SCRIPT, "--bug", "eval", flags=("--plot", "p.png", "--tensorboard", "tb")))
    assert done.returncode == 1, done.stderr
    report = json.loads((folder / "run.json").read_text())
    assert first(report, EVAL) == EVAL
    assert "after step 2, eval batch 1, phase eval, rank 1" in summary(done)
    # rank 0's output up to the stop is the plain run's; no rank trained step 3's update
    assert alone.stdout.startswith(done.stdout) and done.stdout.count("\n") == 2
    assert {r["rank"]: r["ending"] for r in report["ranks"]} == {0: "trip", 1: "trip"}
    assert done.stderr.count("=== HISTORY (per layer, ") == 1  # (step 3's record, opened when the stop came)
    table = done.stderr[done.stderr.index("=== HISTORY"):done.stderr.index("=== SUMMARY")]
    rows = [line.split() for line in table.splitlines()]
    assert {row[0] for row in rows if len(row) > 2} >= {"embed", "attn.qk", "head"}  # (Net's layers)
    total = next(row for row in rows if row[:3] == ["total", "gradient", "norm"])
    assert total[3] == f"{report['history'][0]['grad_norm']:.3g}"  # (rank 1's history: the report's)
    assert (folder / "p.png").read_bytes().startswith(b"\x89PNG") and f"heat map written to {folder / 'p.png'}" in \
        done.stderr
    assert len(list((folder / "tb").glob("events.out.tfevents.*"))) == 1 and "TensorBoard events written to" in \
        done.stderr
    events = read_back(folder / "tb")  # (the top process's own writer: rank 1's history and the one finding)
    assert values(events, "grad_norm/total")[0] == (1, pytest.approx(report["history"][0]["grad_norm"], rel=1e-6))
    finding = events.Tensors("finding/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "aten._softmax.default" in finding and "tests/support/models.py:35" in finding


def test_a_rank_that_exits_while_the_other_trains_is_named_with_its_code(tmp_path_factory):
    done, report = shared(tmp_path_factory, "launched-torchrun-exit", watched(*TORCHRUN, SCRIPT, "--bug", "exit"))
    assert done.returncode not in (0, 2) and done.stdout.count("\n") == 2, done.stderr
    assert report["status"] == "error" and report["exit_code"] == done.returncode
    assert report["error"].startswith("Rank 1 left the run after 2 step(s) while the others trained: it exited "
                                      "with code 3.")
    said = summary(done)
    assert "it exited with code 3" in said and "Ctrl-C" not in said and "SIGABRT" not in done.stderr


def test_under_torchrun_m_debug_nan_rank_1s_validation_nan_is_rank_0s_report(tmp_path_factory):
    done, report = shared(tmp_path_factory, "launched-torchrun-m-eval", lambda folder: run(
        [*TORCHRUN, "-m", "debug_nan", "run", "--report", "run.json", "--", SCRIPT, "--bug", "eval"], folder))
    assert done.returncode == 1, done.stderr
    assert (report["status"], report["exit_code"]) == ("nonfinite", 1)
    assert first(report, EVAL) == EVAL
    assert done.stdout.count("\n") == 2


def test_spawned_workers_are_watched_and_print_their_own_output(tmp_path_factory):
    alone, _ = shared(tmp_path_factory, "launched-spawn-plain", spawned())
    done, report = shared(tmp_path_factory, "launched-spawn-eval", spawned_watched("--bug", "eval"))
    assert alone.returncode == 0 and alone.stdout.count("\n") == 4
    assert done.returncode == 1, done.stderr
    assert first(report, EVAL) == EVAL
    assert alone.stdout.startswith(done.stdout) and done.stdout.count("\n") == 2
    assert "after step 2, eval batch 1, phase eval, rank 1" in summary(done)
    assert report["integration"]["processes_watched"] == 2


def test_lightning_own_ddp_launcher_names_rank_1s_overflow(tmp_path_factory):
    pytest.importorskip("lightning.pytorch")
    alone, _ = shared(tmp_path_factory, "launched-lightning-plain",
                      lightning(lambda folder, **e: run([sys.executable, LIGHTNING], folder, **e)))
    done, report = shared(tmp_path_factory, "launched-lightning",
                          lightning(lambda folder, **e: watched("python", LIGHTNING, "--bug", "overflow", **e)(folder)))
    assert alone.returncode == 0 and alone.stdout.count("\n") == 4, alone.stderr
    assert done.returncode == 1, done.stderr
    assert first(report, OVERFLOW) == OVERFLOW  # (the replay of training_step, redirected as Lightning does)
    assert "step 3, micro-batch 1, phase forward, rank 1" in summary(done)
    assert alone.stdout.startswith(done.stdout) and done.stdout.count("\n") == 3  # step 3's print came first
