"""`debug-nan run` on unmodified HF Trainer and Lightning scripts (tiny models from configs, CPU): healthy runs
print exactly their own output; a planted bug gives the `--task` finding for the same model."""

import subprocess
import sys

import pytest

from tests.support import SUPPORT

HERE = SUPPORT / "run"
TASKS = str(SUPPORT / "frameworks" / "tasks.py")
FIELDS = ("step", "micro_step", "phase", "module", "module_type", "op", "cause", "kind", "source")


def plain(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True, timeout=300)


SCRIPTS = {
    "hf": ("hf_script.py", "transformers", "bert_unlabelled_sequence", ("--bug", "unlabelled")),
    "lightning": ("lightning_script.py", "lightning", "masked_attention", ("--bug", "masked")),
}


def _args(kind: str, tmp_path) -> list[str]:
    return [str(tmp_path / "out")] if kind == "hf" else []


@pytest.mark.parametrize("kind", ["hf", "lightning"])
def test_healthy_script_prints_exactly_its_own_output(tmp_path, run_here, kind):
    script, package, _, _ = SCRIPTS[kind]
    pytest.importorskip(package)
    alone = plain(script, *_args(kind, tmp_path))
    done, stdout, _ = run_here("python", str(HERE / script), *_args(kind, tmp_path))
    assert alone.returncode == 0 and done.code == 0, done.output
    assert stdout == alone.stdout and stdout.strip()
    assert (done.report["status"], done.report["steps_run"]) == ("clean", 6)


@pytest.mark.parametrize("kind", ["hf", "lightning"])
def test_broken_script_same_finding_as_the_task(tmp_path, run_here, run_cli, kind):
    """NaN at micro-batch 2 of 2 (gradient accumulation 2): every label of a sequence ignored (HF), a sample
    with every key masked (Lightning)."""
    script, package, task, bug = SCRIPTS[kind]
    pytest.importorskip(package)
    done, _, stderr = run_here("python", str(HERE / script), *_args(kind, tmp_path), *bug, "--accumulate", "2")
    assert done.code == 1, done.output
    first = done.first
    assert (first["step"], first["micro_step"]) == (2, 2)
    assert done.report["integration"]["pinpoint"].startswith("in place") and "[pinpoint] replaying step" in stderr
    cli = run_cli("--task", f"{TASKS}:{task}", "--device", "cpu", "--max-steps", "6", "--max-grad-norm", "0",
                  "--warmup-steps", "0", "--gradient-accumulation-steps", "2", "--no-bundle")
    assert cli.code == 1, cli.output
    assert {k: first[k] for k in FIELDS} == {k: cli.first[k] for k in FIELDS}
