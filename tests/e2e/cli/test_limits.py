"""Limits and wrong words, table-driven: each row runs `debug-nan ARGS` in an empty folder d (holding faults.py and
what its setup writes) and checks the exit code, the message (in the output and, for exit 2, the error report) and
that no traceback is printed. "{d}" in an argument is the folder. To add a case, add a row."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest
import torch
from click.testing import CliRunner

from debug_nan.app.cli import main
from debug_nan.presentation.bundle import BUNDLE_VERSION, REQUIRED_KEYS
from tests.support.bundles import save_signed
from tests.support import FAULT_TASKS

TASK = ("--task", "faults.py:healthy", "--device", "cpu", "--max-steps", "1")
LONG = "n" * 256  # one over the 255-byte limit of a name on Linux file systems
META_TASK = '''
import torch
from torch import nn


def build():
    return {"model": nn.Linear(3, 1, device="meta"), "batches": [torch.randn(4, 3)] * 2,
            "loss": lambda m, b: m(b).pow(2).mean()}
'''


def _bundle(version=BUNDLE_VERSION, **settings):
    def setup(d):
        save_signed(d / "b.pt", {"version": version, **{k: None for k in REQUIRED_KEYS}, "settings": settings},
                    version=version)
    return setup


def _checkpoint(content: bytes):
    def setup(d):
        if content:
            torch.save({"weight": torch.zeros(1, 3), "bias": torch.zeros(1)}, d / "ck.pt")
            (d / "ck.pt").write_bytes((d / "ck.pt").read_bytes()[:len(content) * 100])  # cut off
        else:
            (d / "ck.pt").write_bytes(b"")
    return setup


@dataclass
class Limit:
    id: str
    args: tuple[str, ...]
    code: int
    message: str
    setup: object = None


LIMITS = [
    Limit("report-name-of-250-characters", (*TASK, "--report", "{d}/" + "r" * 245 + ".json"), 0, "JSON report written"),
    Limit("report-name-over-255-bytes", (*TASK, "--report", f"{{d}}/{LONG}/r.json"), 2,
          "longer than the file system allows (255 bytes per name)"),
    Limit("log-name-over-255-bytes", (*TASK, "--log", f"{{d}}/{LONG}.log"), 2, "--log"),
    Limit("config-name-over-255-bytes", ("--config", f"{{d}}/{LONG}.toml"), 2, "cannot be read: a name in that path"),
    Limit("config-is-a-directory", ("--config", "{d}"), 2, "is a directory"),
    Limit("asv-layers-zero", (*TASK, "--asv-layers", "0"), 2, "--asv-layers must be a positive integer, got 0"),
    Limit("sample-layers-negative", (*TASK, "--sample-layers", "-1"), 2, "--sample-layers must be a positive integer"),
    Limit("encoder-layers-zero", (*TASK, "--encoder-layers", "0"), 2, "--encoder-layers must be a positive integer"),
    Limit("checkpoint-empty", (*TASK, "--checkpoint", "{d}/ck.pt"), 2, "is empty (0 bytes)", _checkpoint(b"")),
    Limit("checkpoint-truncated", (*TASK, "--checkpoint", "{d}/ck.pt"), 2, "is truncated or damaged",
          _checkpoint(b"PK")),
    Limit("task-model-on-meta", ("--task", "meta.py:build", "--device", "cpu", "--max-steps", "1"), 2,
          "`model` is on the meta device", lambda d: (d / "meta.py").write_text(META_TASK)),
    Limit("bundle-of-a-newer-format", ("replay", "{d}/b.pt"), 2, f"was written by a newer debug-nan (bundle version "
                                                                 f"{BUNDLE_VERSION + 1}",
          _bundle(BUNDLE_VERSION + 1)),
    Limit("bundle-with-newer-settings", ("replay", "{d}/b.pt"), 2, "its settings zz_new_option are unknown",
          _bundle(zz_new_option=1)),
    Limit("token-limit-past-any-memory", ("--token-limit", "100000", "--device", "cpu", "--max-steps", "1"), 2,
          "--token-limit 100000: the built-in model would hold at least"),
    Limit("one-sample-never-forms-a-unifrac-pair", ("--synthetic-samples", "1", "--batch-size", "2", "--max-steps",
                                                    "1", "--device", "cpu"), 2, "a smaller --batch-size cannot help"),
]


@pytest.mark.parametrize("case", LIMITS, ids=lambda c: c.id)
def test_a_limit_or_a_wrong_word(tmp_path, monkeypatch, case):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "faults.py").write_text(FAULT_TASKS)
    if case.setup:
        case.setup(tmp_path)
    args = [a.replace("{d}", str(tmp_path)) for a in case.args]
    report = tmp_path / "out.json"
    if "--report" not in args:
        args += ["--report", str(report)]
    else:
        report = tmp_path / args[args.index("--report") + 1]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == case.code, result.output
    assert case.message in result.output and "Traceback" not in result.output, result.output
    if case.message.startswith("longer") or "--report" in case.args and case.code == 2:
        return  # the report's own path is the error: no report can be written there
    data = json.loads(report.read_text())
    assert data["exit_code"] == case.code
    assert case.code != 2 or case.message in data["error"]
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".partial")]  # no temporary file left behind
