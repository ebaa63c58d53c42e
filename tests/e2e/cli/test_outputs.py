"""Outputs and faults, table-driven: no output over an input or another output, write failures at the end, exit 2
from Click's own parsing, and the task failures that used to end in a traceback.

A row is Fault(id, args, code, message, report): `args` run in an empty folder d that holds a table, a tree, a
config and faults.py (tests/support/faults.py); "{d}" is replaced by the folder. For every row: the exit code, the
message, no traceback, every input byte-identical, and `report` (a path under d, or None) holds valid JSON with the
real exit code; with report=None no file named like a report appears. To add a case, add a row.
(Atomic writes: tests/unit/presentation/test_outputs.py.)
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import pytest
from click.testing import CliRunner

from debug_nan.aam.data.writing import write_biom, write_tree
from debug_nan.app.cli import main
from tests.support import FAULT_TASKS
from tests.support.files import fingerprint


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
    Fault("plot-is-the-tree", ("--data-dir", "{d}", "--plot", "{d}/tree.nwk"), 2,
          "--plot {d}/tree.nwk is the same file"),
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
          "without its content (settings, step", setup=lambda d: _save(d / "empty.pt", {"version": 2})),
    Fault("replay-truncated-bundle", ("replay", "{d}/cut.pt", "--report", "{d}/r.json"), 2,
          "does not match its signature", setup=lambda d: _truncated_bundle(d / "cut.pt")),
    Fault("replay-truncated-bundle-trusted", ("replay", "{d}/cut.pt", "--trust", "--report", "{d}/r.json"), 2,
          "looks truncated", setup=lambda d: _truncated_bundle(d / "cut.pt")),
    Fault("replay-a-folder", ("replay", "{d}", "--report", "{d}/r.json"), 2, "Invalid value for 'BUNDLE'"),
]


def _save(path, obj):
    from tests.support.bundles import save_signed

    save_signed(path, obj)


def _truncated_bundle(path):
    import torch

    _save(path, {"version": 2, "settings": {}, "payload": torch.zeros(20000)})
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
    inputs = {k: v for k, v in fingerprint(d).items() if k != "r.json" and not k.startswith("out")}
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    output = result.output
    assert result.exit_code == case.code, output
    assert case.message.replace("{d}", str(d)) in output, output
    assert "Traceback" not in output and "<frozen" not in output
    after = fingerprint(d)
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


def test_every_flag_a_message_names_exists():
    """--nuc-weight, --unifrac-weight and --ffn-mult are named by validation messages: they are real flags."""
    out = CliRunner().invoke(main, ["--nuc-weight", "-1"])
    assert out.exit_code == 2 and "--nuc-weight must be a positive finite number, got -1.0" in out.output
    for flag in ("--unifrac-weight", "--ffn-mult"):
        assert flag in CliRunner().invoke(main, ["--help"]).output
