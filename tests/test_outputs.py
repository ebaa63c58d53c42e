"""Outputs and faults, table-driven: no output over an input or another output, atomic writes, write failures at
the end, exit 2 from Click's own parsing, and the task failures that used to end in a traceback.

A row is Fault(id, args, code, message, report): `args` run in an empty folder d that holds a table, a tree, a
config and faults.py (the tasks below); "{d}" is replaced by the folder. For every row: the exit code, the message,
no traceback, every input byte-identical, and `report` (a path under d, or None) holds valid JSON with the real exit
code; with report=None no file named like a report appears. To add a case, add a row.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from debug_nan.cli import main
from debug_nan.data.writing import write_biom, write_tree
from tests.test_bad_data import _fingerprint

FAULT_TASKS = '"""Tasks that fail in the ways a user\'s task can (written into a temp folder by the tests)."""\nimport os\nimport shutil\nimport sys\nimport time\n\nimport torch\nfrom torch import nn\n\n\nclass T:\n    def __init__(self, model, batches, loss):\n        self.model, self.batches, self.loss = model, batches, loss\n\n\ndef _batches(n=4):\n    g = torch.Generator().manual_seed(0)\n    return [torch.randn(4, 3, generator=g) for _ in range(n)]\n\n\ndef _square(m, b):\n    return m(b).pow(2).mean()\n\n\ndef healthy():\n    torch.manual_seed(0)\n    return T(nn.Linear(3, 1), _batches(), _square)\n\n\ndef removes_path():\n    """Deletes $FAULT_PATH (a folder) at the second loss call: the report\'s or the plot\'s folder goes away."""\n    calls = [0]\n\n    def loss(m, b):\n        calls[0] += 1\n        if calls[0] == 2:\n            shutil.rmtree(os.environ["FAULT_PATH"], ignore_errors=True)\n        return _square(m, b)\n    return T(nn.Linear(3, 1), _batches(), loss)\n\n\ndef frozen():\n    model = nn.Linear(3, 1)\n    model.requires_grad_(False)\n    return T(model, _batches(), _square)\n\n\nclass Broken:\n    def __iter__(self):\n        items = [torch.randn(4, 3)]\n        for k in range(3):\n            yield items[k]\n\n\ndef broken_batches():\n    return T(nn.Linear(3, 1), Broken(), _square)\n\n\ndef exits_in_factory():\n    sys.exit(3)\n\n\ndef exits_in_loss():\n    def loss(m, b):\n        sys.exit(3)\n    return T(nn.Linear(3, 1), _batches(), loss)\n\n\ndef slow():\n    """A step every ~0.1 s, for the signal tests."""\n    def loss(m, b):\n        time.sleep(0.1)\n        return _square(m, b)\n    return T(nn.Linear(3, 1), _batches(), loss)\n\n\ndef nan_at_step_2():\n    calls = [0]\n\n    def loss(m, b):\n        calls[0] += 1\n        out = m(b).pow(2).mean()\n        return out * float("nan") if calls[0] >= 2 else out\n    return T(nn.Linear(3, 1), _batches(), loss)\n\n\ndef interrupted_in_replay():\n    """NaN loss at step 2; the pinpoint replay\'s call of the loss is interrupted (Ctrl-C)."""\n    calls = [0]\n\n    def loss(m, b):\n        calls[0] += 1\n        if calls[0] >= 3:\n            raise KeyboardInterrupt\n        out = m(b).pow(2).mean()\n        return out * float("nan") if calls[0] == 2 else out\n    return T(nn.Linear(3, 1), _batches(), loss)\n\n\ndef fails_on_rank_1():\n    if os.environ.get("RANK") == "1":\n        raise ValueError("rank 1 cannot open its shard")\n    return healthy()\n\n\ndef log_of_negative_in_batch_2():\n    """Stateless (replayable): batch 2 holds -3, and the loss takes log(x + 2) of it."""\n    batches = _batches()\n    batches[1][0, 0] = -3.0\n\n    def loss(m, b):\n        return m(b).pow(2).mean() + torch.log(b[0, 0] + 2)\n    return T(nn.Linear(3, 1), batches, loss)\n'


@dataclass
class Fault:
    id: str
    args: tuple[str, ...]
    code: int
    message: str
    report: str | None = "r.json"
    setup: object = None  # setup(d) before the run
    env: dict = field(default_factory=dict)
    status: str | None = None  # the report's status (default: error for exit 2, else clean)


TASK = ("--task", "{d}/faults.py:healthy", "--device", "cpu", "--max-steps", "2")


def _read_only_report(d):
    (d / "r.json").write_text("{}")
    os.chmod(d / "r.json", 0o444)


def _link(name, target):
    def setup(d):
        (d / name).symlink_to(d / target)
    return setup


def _hard_link(d):
    os.link(d / "table.biom", d / "copy.biom")


def _bundle_named_report(d):
    pass


FAULTS = [
    # an output path that is an input path
    Fault("report-is-the-table", ("--table", "{d}/table.biom", "--tree", "{d}/tree.nwk", "--report", "{d}/table.biom"),
          2, "--report {d}/table.biom is the same file as the --table {d}/table.biom", None),
    Fault("report-is-the-tree", ("--data-dir", "{d}", "--report", "{d}/tree.nwk"), 2,
          "is the same file as the --data-dir file tree.nwk", None),
    Fault("report-is-the-config", ("--config", "{d}/job.toml", "--report", "{d}/job.toml"), 2,
          "is the same file as the --config {d}/job.toml", None),
    Fault("log-is-the-table", ("--table", "{d}/table.biom", "--tree", "{d}/tree.nwk", "--log", "{d}/table.biom"), 2,
          "--log {d}/table.biom is the same file as the --table"),
    Fault("plot-is-the-tree", ("--data-dir", "{d}", "--plot", "{d}/tree.nwk"), 2, "--plot {d}/tree.nwk is the same file"),
    Fault("report-is-the-task-file", (*TASK, "--report", "{d}/faults.py"), 2, "is the same file as the --task file",
          None),
    Fault("report-through-a-symlink-to-the-table", ("--data-dir", "{d}", "--report", "{d}/out.json"), 2,
          "--report {d}/out.json is the same file as the --data-dir file table.biom", None,
          setup=_link("out.json", "table.biom")),
    Fault("report-is-a-hard-link-of-the-table", ("--table", "{d}/copy.biom", "--tree", "{d}/tree.nwk", "--report",
                                                 "{d}/table.biom"), 2, "is the same file as the --table", None,
          setup=_hard_link),
    Fault("report-is-the-log", (*TASK, "--report", "{d}/r.json", "--log", "{d}/r.json"), 2,
          "--report {d}/r.json and --log {d}/r.json are the same file", None),
    Fault("plot-is-the-report", (*TASK, "--report", "{d}/r.json", "--plot", "{d}/r.json"), 2, "are the same file",
          None),
    Fault("report-named-like-a-bundle", (*TASK, "--report", "{d}/debug-nan-bundle-step1-micro1.pt", "--bundle-dir",
                                         "{d}"), 2, "has the name of a repro bundle", None),
    Fault("bad-option-with-the-report-on-the-config", ("--config", "{d}/job.toml", "--lr", "nan", "--report",
                                                       "{d}/job.toml"), 2, "--lr must be a positive finite", None),
    # Click's own usage errors leave the error report
    Fault("click-bad-choice", (*TASK, "--precision", "fp8", "--report", "{d}/r.json"), 2,
          "Invalid value for '--precision'"),
    Fault("click-unknown-option", (*TASK, "--bogus", "--report", "{d}/r.json"), 2, "No such option '--bogus'"),
    Fault("click-wrong-type", ("--max-steps", "ten", "--report", "{d}/r.json"), 2, "'ten' is not a valid integer"),
    Fault("click-report-first", ("--report={d}/r.json", "--batch-size", "x"), 2, "'x' is not a valid integer"),
    Fault("click-error-with-the-report-on-the-table", ("--max-steps", "x", "--table", "{d}/table.biom", "--report",
                                                      "{d}/table.biom"), 2, "no error report written", None),
    # a --report Click itself could not parse cannot be honoured: said so, no file
    Fault("click-report-without-value", ("--max-steps", "1", "--report"), 2,
          "the value of --report could not be read from the command line", None),
    Fault("replay-click-error", ("replay", "{d}/nope.pt", "--bogus", "--report", "{d}/r.json"), 2, "No such option"),
    # outputs that cannot be written
    Fault("read-only-report", (*TASK, "--report", "{d}/r.json"), 2, "exists and is read-only", None,
          setup=_read_only_report),
    Fault("report-is-a-device", (*TASK, "--report", "/dev/null"), 2, "is not a regular file", None),
    Fault("report-folder-deleted-during-the-run", ("--task", "{d}/faults.py:removes_path", "--device", "cpu",
                                                   "--max-steps", "3", "--report", "{d}/out/r.json"), 2,
          "--report {d}/out/r.json: could not be written", None, env={"FAULT_PATH": "{d}/out"}),
    Fault("plot-folder-deleted-during-the-run", ("--task", "{d}/faults.py:removes_path", "--device", "cpu",
                                                 "--max-steps", "3", "--plot", "{d}/plots/h.png"), 2,
          "--plot {d}/plots/h.png: could not be written", "r.json", env={"FAULT_PATH": "{d}/plots"}, status="clean"),
    Fault("log-on-dev-full", (*TASK, "--log", "/dev/full"), 0, "writing the log copy failed (No space left on device)"),
    # the task's failures: messages, not tracebacks
    Fault("task-without-trainable-parameters", ("--task", "{d}/faults.py:frozen", "--device", "cpu"), 2,
          "`model` has no trainable parameter"),
    Fault("task-batches-raise", ("--task", "{d}/faults.py:broken_batches", "--device", "cpu"), 2,
          "The task's `batches` (broken_batches) raised IndexError: list index out of range (at"),
    Fault("task-factory-sys-exit", ("--task", "{d}/faults.py:exits_in_factory", "--device", "cpu"), 2,
          "calling it raised SystemExit (sys.exit(3))"),
    Fault("task-loss-sys-exit", ("--task", "{d}/faults.py:exits_in_loss", "--device", "cpu"), 1,
          "the task's loss called sys.exit(3)", status="error"),
    Fault("task-syntax-error", ("--task", "{d}/bad_syntax.py:build", "--device", "cpu"), 2,
          "SyntaxError: invalid syntax (at", setup=lambda d: (d / "bad_syntax.py").write_text("def build(:\n")),
    Fault("ctrl-c-during-the-pinpoint-replay", ("--task", "{d}/faults.py:interrupted_in_replay", "--device", "cpu",
                                                "--max-steps", "4"), 130,
          "the op-level replay was interrupted (Ctrl-C)", status="nonfinite"),
    # replay failures: exit 2 with the error report
    Fault("replay-report-is-the-bundle", ("replay", "{d}/b.pt", "--report", "{d}/b.pt"), 2,
          "--report {d}/b.pt is the same file as the bundle", None, setup=lambda d: (d / "b.pt").write_bytes(b"x")),
    Fault("replay-bundle-without-content", ("replay", "{d}/empty.pt", "--report", "{d}/r.json"), 2,
          "without its content (settings, step", setup=lambda d: _save(d / "empty.pt", {"version": 1})),
    Fault("replay-truncated-bundle", ("replay", "{d}/cut.pt", "--report", "{d}/r.json"), 2, "looks truncated",
          setup=lambda d: _truncated_bundle(d / "cut.pt")),
    Fault("replay-a-folder", ("replay", "{d}", "--report", "{d}/r.json"), 2, "Invalid value for 'BUNDLE'"),
]


def _save(path, obj):
    import torch

    torch.save(obj, path)


def _truncated_bundle(path):
    import torch

    torch.save({"version": 1, "settings": {}, "payload": torch.zeros(20000)}, path)
    path.write_bytes(path.read_bytes()[:30000])


@pytest.fixture
def fault_dir(tiny_data, tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    write_biom(tiny_data, d / "table.biom")
    write_tree(tiny_data, d / "tree.nwk")
    (d / "job.toml").write_text("[data]\ntoken_limit = 24\nbatch_size = 4\n[train]\nmax_steps = 1\n")
    (d / "faults.py").write_text(FAULT_TASKS)
    return d


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id) for c in FAULTS])
def test_fault(case: Fault, fault_dir, monkeypatch):
    d = fault_dir
    monkeypatch.chdir(d)
    if case.setup:
        case.setup(d)
    for key, value in case.env.items():
        monkeypatch.setenv(key, value.replace("{d}", str(d)))
    args = [a.replace("{d}", str(d)) for a in case.args]
    if case.report == "r.json" and not any(a.startswith("--report") for a in args):
        args += ["--report", str(d / "r.json")]
    inputs = {k: v for k, v in _fingerprint(d).items() if k != "r.json" and not k.startswith("out")}
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    output = result.output
    assert result.exit_code == case.code, output
    assert case.message.replace("{d}", str(d)) in output, output
    assert "Traceback" not in output and "<frozen" not in output
    after = _fingerprint(d)
    assert {k: after.get(k) for k in inputs} == inputs  # no input written, moved or deleted
    assert not [k for k in after if k.endswith(".partial") or ".debug-nan-probe-" in k]
    if case.report is not None:
        report = json.loads((d / case.report).read_text())
        assert report["exit_code"] == case.code
        assert report["status"] == (case.status or ("error" if case.code == 2 else "clean"))
    if case.code == 2:
        assert output.count("debug-nan: error:") == 1
    if case.code in (0, 1, 130) or case.id.startswith(("report-folder", "plot-folder")):
        assert "SUMMARY" in output  # the stdout summary is printed, whatever happened to the files


def test_plot_failure_keeps_the_report_with_the_real_exit_code(fault_dir, monkeypatch):
    d = fault_dir
    monkeypatch.chdir(d)
    monkeypatch.setenv("FAULT_PATH", str(d / "plots"))
    out = CliRunner().invoke(main, ["--task", f"{d}/faults.py:removes_path", "--device", "cpu", "--max-steps", "3",
                                    "--plot", str(d / "plots" / "h.png"), "--report", str(d / "r.json")])
    report = json.loads((d / "r.json").read_text())
    assert out.exit_code == 2 and report["exit_code"] == 2 and report["steps_run"] == 3
    assert any("--plot" in note and "The run itself ended with exit 0" in note for note in report["notes"])


def test_atomic_write_keeps_the_old_file_when_the_write_fails(tmp_path):
    from debug_nan.report.outputs import OutputWriteError, atomic_write

    target = tmp_path / "r.json"
    target.write_text("old")

    def half_then_fail(handle):
        handle.write(b"half")
        raise OSError(28, "No space left on device")

    with pytest.raises(OutputWriteError, match="No space left on device"):
        atomic_write(target, half_then_fail, "--report")
    assert target.read_text() == "old" and os.listdir(tmp_path) == ["r.json"]


def test_atomic_write_through_a_symlink_keeps_the_link_and_the_mode(tmp_path):
    from debug_nan.report.outputs import write_text_atomic

    real = tmp_path / "real.json"
    real.write_text("old")
    os.chmod(real, 0o640)
    (tmp_path / "link.json").symlink_to(real)
    write_text_atomic(tmp_path / "link.json", "new", "--report")
    assert (tmp_path / "link.json").is_symlink() and real.read_text() == "new"
    assert real.stat().st_mode & 0o777 == 0o640


def test_out_of_memory_message_names_the_sizes_not_a_guess():
    from debug_nan.runner import oom_message
    from debug_nan.settings import RunSettings

    s = RunSettings(batch_size=2, token_limit=4096, heads=4)
    # the sample-level attention scores: 2 x 4 x 4096 x 4096 x 4 bytes = 512 MiB
    text = oom_message(RuntimeError("CPU: Tried to allocate 512.00 MiB"), s, None)
    assert "sample-level attention scores [batch 2 x 4 heads x token limit 4096 x 4096] = 512.00 MiB" in text
    assert "The failed allocation is the size of the sample-level attention scores." in text
    assert "--batch-size" not in text  # already the smallest (UniFrac needs pairs)
    assert "lower --token-limit (now 4096)" in text


def test_every_flag_a_message_names_exists():
    """--nuc-weight, --unifrac-weight and --ffn-mult are named by validation messages: they are real flags."""
    out = CliRunner().invoke(main, ["--nuc-weight", "-1"])
    assert out.exit_code == 2 and "--nuc-weight must be a positive finite number, got -1.0" in out.output
    for flag in ("--unifrac-weight", "--ffn-mult"):
        assert flag in CliRunner().invoke(main, ["--help"]).output


def test_task_failing_on_one_rank_under_torchrun_goes_through_the_agreement(tmp_path):
    """Rank 1's factory raises: both ranks exit 2 together and rank 0 writes the error report naming rank 1."""
    from tests.train.test_distributed import assert_every_rank_exited, torchrun

    (tmp_path / "faults.py").write_text(FAULT_TASKS)
    proc, seconds = torchrun("--task", "faults.py:fails_on_rank_1", "--device", "cpu", "--report", "r.json",
                             cwd=tmp_path)
    assert proc.returncode != 0 and seconds < 90, proc.stdout + proc.stderr  # torchrun's own code is 1
    assert_every_rank_exited(proc, "2")  # both workers exited 2, none was killed
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["exit_code"] == 2 and "rank 1 could not set up the run" in report["error"]
    assert "ValueError: rank 1 cannot open its shard" in report["error"]


FAKE_PIP = r'''#!/usr/bin/env bash
echo "pip $*" >> "$PIP_LOG"
if [[ " $* " == *" --dry-run "* ]]; then
    [[ "$FAKE_DEFAULT" == offline ]] && exit 1
    report="${@: -2:1}"
    for a in "$@"; do if [[ "$prev" == --report ]]; then report="$a"; fi; prev="$a"; done
    if [[ "$FAKE_DEFAULT" == cuda ]]; then
        printf '{"install": [{"metadata": {"name": "torch"}}, {"metadata": {"name": "nvidia-cublas-cu12"}}]}' > "$report"
    else
        printf '{"install": [{"metadata": {"name": "torch"}}]}' > "$report"
    fi
    exit 0
fi
if [[ " $* " == *" --index-url "* && "$FAKE_CPU_INDEX" == down ]]; then exit 1; fi
exit 0
'''


@pytest.mark.parametrize("default, cpu_index, code, installs", [
    ("cpu", "ok", 0, ["torch==2.13.0"]),  # this workplace: the default index has the local CPU build
    ("cuda", "ok", 0, ["-q --timeout 30 --retries 1 --index-url https://download.pytorch.org/whl/cpu torch==2.13.0"]),
    ("offline", "ok", 0, ["-q --timeout 30 --retries 1 --index-url https://download.pytorch.org/whl/cpu torch==2.13.0"]),
    ("cuda", "down", 1, []),  # never the CUDA build on a machine without a GPU: stop and say how
])
def test_setup_script_never_installs_cuda_torch_without_a_gpu(tmp_path, default, cpu_index, code, installs):
    import shutil
    import subprocess

    from tests.conftest import REPO

    (tmp_path / "scripts").mkdir()
    shutil.copy(REPO / "scripts" / "setup.sh", tmp_path / "scripts" / "setup.sh")
    venv = tmp_path / ".venv" / "bin"
    venv.mkdir(parents=True)
    (venv / "python").write_text("#!/bin/sh\nexit 1\n")  # a fresh venv: no torch
    (tmp_path / "pip").write_text(FAKE_PIP)
    for exe in (venv / "python", tmp_path / "pip"):
        exe.chmod(0o755)
    log = tmp_path / "pip.log"
    env = dict(os.environ, DEBUG_NAN_GPU="0", DEBUG_NAN_PIP=str(tmp_path / "pip"), PIP_LOG=str(log),
               FAKE_DEFAULT=default, FAKE_CPU_INDEX=cpu_index)
    env.pop("VIRTUAL_ENV", None)
    env.pop("CONDA_PREFIX", None)
    proc = subprocess.run(["bash", str(tmp_path / "scripts" / "setup.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == code, proc.stdout + proc.stderr
    calls = log.read_text().splitlines()
    torch_installs = [c.split("install ", 1)[1] for c in calls if "torch==" in c and "--dry-run" not in c]
    expected = [i if "--index-url" in i else f"-q {i}" for i in installs]
    if cpu_index == "down":  # tried the CPU index, which failed; nothing else
        assert all("--index-url" in c for c in torch_installs) and "the default index would install the CUDA build" \
            in proc.stderr
    else:
        assert torch_installs == expected
    assert not any("nvidia" in c for c in calls)
