"""presentation/report.py: one layout with a schema_version for every entry point's report (a run's, a run that
never started, a callback's, `run`'s), and the settings each entry point reports: the ones it ran with."""

import json
from types import SimpleNamespace

import torch

import debug_nan
from debug_nan.app.run_options import RunOptions
from debug_nan.drivers.framework_outputs import CALLBACK_SETTINGS, Outputs, run_settings
from debug_nan.engine.explain.finding import Finding
from debug_nan.engine.session.result import RunResult
from debug_nan.engine.watch.history import History
from debug_nan.presentation.log import Log
from debug_nan.presentation.report import (
    SCHEMA_VERSION,
    NotRun,
    build_report,
    write_error_report,
    write_interrupted_report,
)

LAYOUT = ["schema_version", "status", "steps_run", "first_nonfinite", "findings", "error", "interrupted",
          "exit_code", "elapsed_s", "device", "torch", "debug_nan", "settings", "history", "history_kept", "notes",
          "warnings", "recipe"]


def finding(step: int = 2) -> Finding:
    return Finding(step=step, micro_step=1, phase="loss", module="", module_type="", op=None, kind="nan",
                   cause="unknown", explanation="the loss is nan", source="train.py:9", suggestions=["look"])


def test_a_runs_report_has_the_one_layout_and_its_schema_version():
    result = RunResult(status="nonfinite", steps_run=2, findings=[finding(2), finding(3)], notes=["a note"],
                       recipe={"optimizer": "SGD"})
    data = build_report(result, exit_code=1, settings={"max_steps": 5}, device=torch.device("cpu"), elapsed=1.23456,
                        integration={"framework": "x"})
    assert list(data) == [*LAYOUT, "integration"] and SCHEMA_VERSION == data["schema_version"] == 1
    assert data["first_nonfinite"]["step"] == 2 and [f["step"] for f in data["findings"]] == [2, 3]
    assert (data["exit_code"], data["elapsed_s"], data["device"], data["settings"]) == (1, 1.235, "cpu",
                                                                                        {"max_steps": 5})
    assert (data["torch"], data["debug_nan"]) == (torch.__version__, debug_nan.__version__)
    assert data["history"] == [] and data["notes"] == ["a note"] and data["recipe"] == {"optimizer": "SGD"}


def test_the_reports_of_runs_that_never_started_have_the_same_keys(tmp_path):
    write_error_report(str(tmp_path / "error.json"), "bad option", 2)
    write_interrupted_report(str(tmp_path / "stopped.json"), 130, "Interrupted (Ctrl-C) before the run started.")
    error, stopped = (json.loads((tmp_path / name).read_text()) for name in ("error.json", "stopped.json"))
    assert list(error) == list(stopped) == LAYOUT
    assert (error["status"], error["error"], error["exit_code"], error["settings"]) == ("error", "bad option", 2, None)
    assert (stopped["status"], stopped["interrupted"], stopped["exit_code"]) == ("clean", True, 130)
    assert stopped["notes"] == ["Interrupted (Ctrl-C) before the run started."] and stopped["steps_run"] == 0
    assert build_report(NotRun("error", error="x"), exit_code=2)["history_kept"] is None


def test_run_reports_its_own_options_not_the_jobs_defaults():
    options = RunOptions(report="/r/run.json", max_steps=4, bundle_dir=None, trace_at=(3, 1), plot="/r/p.png")
    settings = options.report_settings()
    assert settings == {"report": "/r/run.json", "log": None, "plot": "/r/p.png", "tensorboard": None,
                        "history": "compact", "max_steps": 4, "explosion_threshold": 1e4, "explosion_growth": 1e3,
                        "deterministic": False, "bundle_dir": None, "bundle": False, "trace_at": [3, 1]}


def test_a_callback_reports_what_it_read_from_the_framework_and_its_options(tmp_path):
    outputs = Outputs(str(tmp_path / "cb.json"), None, True, None, "raise")
    outputs.log = Log(None, stream=open(tmp_path / "log.txt", "w"))
    model = torch.nn.Linear(2, 1)
    monitor = SimpleNamespace(optimizer=torch.optim.SGD(model.parameters(), lr=0.5), steps_run=3, findings=[],
                              history=History(), notes=[], error=None, model=model, device=torch.device("cpu"))
    settings = run_settings(outputs, task="t.py:build", device="cpu", optimizer=monitor.optimizer, accumulation=4,
                            precision="bf16", max_grad_norm=None, max_steps=3, seed=0, explosion_threshold=1e4,
                            explosion_growth=1e3)
    result = outputs.conclude(monitor, settings, {"framework": "lightning"})
    data = json.loads((tmp_path / "cb.json").read_text())
    assert result.status == "clean" and data["exit_code"] is None  # the framework's to decide
    assert list(data["settings"]) == [*CALLBACK_SETTINGS, "on_trip"] and data["settings"]["on_trip"] == "raise"
    assert (data["settings"]["gradient_accumulation_steps"], data["settings"]["precision"]) == (4, "bf16")
    assert "token_limit" not in data["settings"] and "warmup_steps" not in data["settings"]
    assert data["integration"] == {"framework": "lightning"} and data["recipe"]["lr"] == 0.5


def test_a_callbacks_and_runs_bundle_record_what_they_used_and_no_setting_of_the_built_in_task(tmp_path):
    """The repro bundle's `settings` (engine/session/repro.py: the driver's RunSettings.to_dict()): a callback's
    the framework's recipe, its watch and its outputs; `run`'s the watch's and the outputs' alone (its training is
    the script's). Never the CLI job's AAM defaults."""
    from debug_nan.app.job_settings import SECTIONS

    aam = set(SECTIONS["data"] + SECTIONS["model"]) | {"eval_samples"}
    outputs = Outputs(str(tmp_path / "cb.json"), None, True, None, "stop")
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.25, weight_decay=0.1)
    callback = run_settings(outputs, task="t.py:build", device="cpu", optimizer=optimizer, accumulation=2,
                            precision="bf16", max_grad_norm=1.0, max_steps=3, seed=5, explosion_threshold=10.0,
                            explosion_growth=2.0, snapshot_every=4).to_dict()
    assert not aam & set(callback)
    unknown = run_settings(outputs, task=None, device="cpu", optimizer=optimizer, accumulation=1, precision="fp32",
                           max_grad_norm=None, max_steps=-1, seed=None, explosion_threshold=1e4,
                           explosion_growth=1e3).to_dict()
    assert (unknown["max_steps"], unknown["seed"]) == (None, None)  # Lightning without max_steps nor a seed
    assert (callback["lr"], callback["weight_decay"], callback["gradient_accumulation_steps"], callback["seed"],
            callback["explosion_threshold"], callback["snapshot_every"], callback["bundle_dir"]) == \
        (0.25, 0.1, 2, 5, 10.0, 4, str(tmp_path))
    run = RunOptions(report="/r/run.json", explosion_growth=7.0, bundle_dir="/r", plot="/r/p.png").settings()
    assert run.train is None and run.accumulation_steps == 1
    record = run.to_dict()
    assert not aam & set(record) and "lr" not in record and "seed" not in record
    assert (record["explosion_growth"], record["plot"], record["bundle_dir"], record["bundle"]) == \
        (7.0, "/r/p.png", "/r", True)
