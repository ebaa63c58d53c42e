"""The log fits the screen: every line of a real run within 100 columns, the history of a 32-block model one
screen tall, --quiet, --version and the grouped --help."""

import pytest
from click.testing import CliRunner

import debug_nan
from debug_nan.app.cli import main
from tests.support import SUPPORT

DEEP = SUPPORT / "tasks" / "deep_stack.py"


@pytest.fixture(autouse=True)
def _default_width(monkeypatch):
    monkeypatch.delenv("DEBUG_NAN_LOG_WIDTH", raising=False)  # conftest turns wrapping off for the other tests


def block(output: str, title: str) -> list[str]:
    return output.split(f"=== {title}")[1].split("\n\n")[0].splitlines()[1:]


def test_a_32_block_run_fits_100_columns_and_one_screen(run_cli, tmp_path):
    run = run_cli("--task", f"{DEEP}:build", "--max-steps", "3", "--device", "cpu", "--log", str(tmp_path / "l"))
    assert run.code == 0, run.output
    lines = run.output.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert max(len(line) for line in (tmp_path / "l").read_text().splitlines()) <= 100
    history = block(run.output, "HISTORY")
    assert len(history) <= 16, "\n".join(history)
    assert any(line.startswith("  layers.0..31 (Block x 32)") for line in history)


def test_a_step_1_trip_in_a_deep_model(run_cli):
    run = run_cli("--task", f"{DEEP}:build_log_gate", "--max-steps", "3", "--device", "cpu")
    assert run.code == 1 and run.first["module"] == "layers.17.mlp" and run.first["cause"] == "log_of_nonpositive"
    assert max(len(line) for line in run.output.splitlines()) <= 100
    history = block(run.output, "HISTORY")
    assert len(history) <= 12 and sum(" nan " in line for line in history) <= 2, "\n".join(history)
    assert "headroom infx" not in run.output


def test_quiet_prints_the_header_a_line_per_step_and_the_summary(run_cli):
    run = run_cli("--task", f"{DEEP}:build", "--max-steps", "3", "--device", "cpu", "--quiet")
    assert run.code == 0, run.output
    steps = [line for line in run.output.splitlines() if line.startswith("  step ")]
    assert [s.split(" | ")[0] for s in steps] == ["  step 1/3", "  step 2/3", "  step 3/3"]
    assert all(s.endswith(" | ok") and " | loss " in s for s in steps)
    assert "=== STEP" not in run.output and "HISTORY" not in run.output and "[grads]" not in run.output
    assert run.output.startswith("=== debug-nan") and "=== SUMMARY" in run.output


def test_version():
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0 and result.output == f"debug-nan {debug_nan.__version__}\n"


def test_help_is_grouped_and_describes_the_task_interface():
    out = CliRunner().invoke(main, ["--help"], terminal_width=100).output
    titles = [line for line in out.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert titles == ["General options:", "Training options:", "Check options (the watch, the snapshot, the "
                      "replay):", "AAM pipeline options (the built-in model and data; a --task may read them):",
                      "Output options:", "Distributed (torchrun):", "Your own model: --task:", "Commands:"]
    training = out.split("Training options:")[1].split("Check options")[0]
    checks, aam = out.split("Check options")[1].split("AAM pipeline options")
    aam, outputs = aam.split("Output options:")
    assert "--lr" in training and "--token-limit" not in training and "--guards / --no-guards" in aam
    assert "--keep-going" in checks and "--lr" not in checks
    assert "--tensorboard DIRECTORY" in outputs and "--history [compact|full]" in outputs
    assert "loss(model, batch)" in out and "torchrun --nproc_per_node" in out
    assert max(len(line) for line in out.splitlines()) <= 100


def test_a_narrower_width_narrows_the_history_table_too(run_cli, monkeypatch):
    """The table is laid out at the log's width: as many rows as at 100 columns, none wrapped (at 75 columns the
    labels lose their module types: `layers.0..31`)."""
    def history(width: str) -> list[str]:
        monkeypatch.setenv("DEBUG_NAN_LOG_WIDTH", width)
        run = run_cli("--task", f"{DEEP}:build", "--max-steps", "3", "--device", "cpu")
        assert run.code == 0 and max(len(line) for line in run.output.splitlines()) <= int(width), run.output
        return block(run.output, "HISTORY")

    def rows(lines: list[str]) -> list[str]:  # the table itself: up to its total, the legend after it
        return lines[:next(i for i, line in enumerate(lines) if "total gradient norm" in line) + 1]

    wide, narrow = history("100"), history("75")
    assert len(rows(narrow)) == len(rows(wide)) and max(map(len, narrow)) <= 75 < max(map(len, wide))
    assert any(line.startswith("  layers.0..31 ") for line in narrow)
