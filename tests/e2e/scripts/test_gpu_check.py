"""scripts/gpu_check.py on the CPU (--quick): every item runs or says why not, the JSON holds real values, the
Markdown table is written, and --budget-s stops it cleanly. (On a GPU the same command runs at full size.)"""

import json
import subprocess
import sys

import pytest

from tests.conftest import REPO
from tests.support.once import once

SCRIPT = str(REPO / "scripts" / "gpu_check.py")
NO_CUDA = "skipped (no CUDA)"
ITEMS = ["watch_syncs", "all_masked_sdpa", "demo_job", "cuda_tests", "gpt_run", "fsdp2_run", "aam_fsdp_run",
         "launchers", "mixed_precision", "memory", "all_masked_encoder", "oom", "overhead", "run_overhead"]
SKIPPED_ON_CPU = ("oom", "aam_fsdp_run", "launchers", "mixed_precision")  # (CUDA-only items: no command runs)


def gpu_check(out, *args: str, timeout: int = 600) -> tuple[subprocess.CompletedProcess, dict]:
    """The script run from `out`'s parent folder (not the repository) with a relative --out, as a new user runs
    it (`--out gpu-check/`)."""
    proc = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--quick", "--out", f"{out.name}/", *args],
                          cwd=out.parent, capture_output=True, text=True, timeout=timeout)
    return proc, json.loads((out / "gpu-check.json").read_text())


@pytest.fixture(scope="session")
def quick(tmp_path_factory):
    """The quick run, made once for the whole session (tests/support/once.py), from another folder than the
    repository with a relative --out (every item's paths then resolve against other folders: none may fail)."""
    proc, out = once(tmp_path_factory, "gpu-check", lambda folder: gpu_check(folder)[0])
    report = json.loads((out / "gpu-check.json").read_text())
    return proc, report, {i["name"]: i for i in report["items"]}, out


def test_quick_run_passes_with_real_figures(quick):
    """One test of the shared quick run: a second test would wait for it on the other pytest worker, idle (the
    run takes a minute of the suite's two CPUs)."""
    passes_and_writes_json_and_table(*quick)
    figures_are_real(quick[2])
    benchmark_figures_are_real(quick[2], quick[3])


def passes_and_writes_json_and_table(proc, report, items, out):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list(items) == ITEMS
    assert report["counts"] == {"pass": 10, "fail": 0, "skipped": 4, "not run": 0}
    env = report["environment"]
    assert env["device"] == "cpu" and env["gpu"] is None and env["torch"].startswith("2.")
    assert report["command"].startswith("python scripts/gpu_check.py --device cpu --quick")
    for item in items.values():
        assert set(item) == {"name", "title", "status", "reason", "summary", "figures", "commands", "seconds"}
        assert item["seconds"] >= 0 and (item["commands"] or item["name"] in SKIPPED_ON_CPU)
        assert all(c.startswith("python ") for c in item["commands"])
    table = (out / "gpu-check.md").read_text()
    assert "| check | result | figures | s |" in table and "no GPU: cpu" in table
    assert all(item["title"] in table for item in items.values()) and "Left out: checklist 1" in table
    assert (out / "gpu-check-files" / "demo_job").is_dir()  # every command's output is kept
    assert items["watch_syncs"]["commands"] == ["python scripts/gpu_check.py --device cpu --quick --only watch_syncs"]


def figures_are_real(items):
    demo = items["demo_job"]["figures"]
    assert set(demo) == {"fp32", "fp32-no-guards"}  # --quick on the CPU: fp32 alone (bf16, fp16: test_cli.py)
    assert (demo["fp32"]["exit"], demo["fp32"]["status"], demo["fp32"]["steps_run"]) == (0, "clean", 2)
    broken = demo["fp32-no-guards"]
    assert (broken["exit"], broken["cause"], broken["phase"]) == (1, "all_masked_softmax", "forward")
    assert demo["fp32"]["peak_cuda_mib"] == NO_CUDA
    assert sorted(c.split(" --report ")[0] for c in items["demo_job"]["commands"]) == [  # (run 2 at a time)
        "python -m debug_nan --config configs/tiny.toml --max-steps 2 --device cpu",
        "python -m debug_nan --config configs/tiny.toml --max-steps 2 --device cpu --no-guards"]
    encoder = items["all_masked_encoder"]["figures"]
    assert encoder["exit"] == 1 and encoder["fast_path_alone_gives_nan"] is True
    assert (encoder["finding"]["cause"], encoder["finding"]["phase"]) == ("all_masked_softmax", "eval")
    assert encoder["finding"]["op"] == "aten._transformer_encoder_layer_fwd.default"
    sdpa = items["all_masked_sdpa"]["figures"]
    assert sdpa["efficient"] == NO_CUDA and any("flash" in k for k in sdpa["flash"]["kernels"])
    # torch's CPU kernel gives rows without a key zeros: nothing to find, and the Monitor found nothing
    assert sdpa["flash"]["output_nonfinite"] is False and sdpa["flash"]["finding"] is None
    gpt = items["gpt_run"]["figures"]
    assert (gpt["exit"], gpt["step"], gpt["op"], gpt["cause"]) == (1, 3, "aten.div.Tensor", "div_by_zero")
    syncs = items["watch_syncs"]["figures"]["entry_points"]
    assert set(syncs) == {"Watch", "Monitor", "Trainer (accumulation 1)", "Trainer (accumulation 3)"}
    assert all(r["dispatch_counter_per_micro_batch"] == 1 and r["cuda_syncs_per_micro_batch"] == NO_CUDA
               for r in syncs.values())
    tests = items["cuda_tests"]["figures"]["counts"]
    # collected only on the CPU: the CUDA-only tests (5, and the 8 cases of Lightning's and Accelerate's FSDP under
    # `debug-nan run`) and the watch's sync tests
    assert tests["tests collected"] >= 19 and set(tests) == {"tests collected"}
    assert items["cuda_tests"]["commands"][0].startswith("python -m pytest -q -rs -p no:cacheprovider --collect-only")
    sharded = items["fsdp2_run"]["figures"]  # (--quick on the CPU: the planted bug alone, the healthy run is a test's)
    assert (sharded["ranks"], sharded["backend"], sharded["lr_exit"], sharded["step"], sharded["phase"]) == (
        2, "gloo", 1, 2, "forward") and (sharded["rank"], sharded["first_ranks"]) == (0, [0, 1])
    assert sharded["healthy_exit"].startswith("not run (--quick on the CPU")
    for name in SKIPPED_ON_CPU:
        assert items[name]["status"] == "skipped" and items[name]["reason"].startswith(NO_CUDA), items[name]
        assert not items[name]["commands"] and not items[name]["figures"]


def benchmark_figures_are_real(items, out):
    """The memory and overhead items, and the JSON of the benchmark scripts they ran (each mode of each script:
    scripts/bench_memory.py and bench_overhead.py are tested here, where the quick run runs them anyway)."""
    memory = items["memory"]["figures"]["aam-tiny"]
    assert memory["measure"] == "peak_rss_mb" and memory["plain"]["x_plain"] == 1.0 and memory["host"]["mb"] > 0
    assert memory["host"]["cuda_max_allocated_mb"] == NO_CUDA and memory["parameters"] > 30_000
    results = json.loads((out / "gpu-check-files" / "memory" / "aam-tiny" / "bench.json").read_text())["results"]
    assert [r["mode"] for r in results] == ["plain", "host"]  # each in its own process, the same model
    assert all(r["params"] == memory["parameters"] and r["peak_rss_mb"] >= r["baseline_rss_mb"] > 0
               and r["cuda_max_allocated_mb"] is None for r in results)
    overhead = items["overhead"]["figures"]["aam"]
    modes = {"plain", "watch", "watch_only", "watch_all", "monitor", "snapshot", "trace", "detect_anomaly",
             "naive_hooks"}
    assert set(overhead["ratio_to_plain"]) == modes
    assert overhead["ratio_to_plain"]["plain"] == 1.0 and overhead["host_syncs_per_watch_step"] == NO_CUDA
    data = json.loads((out / "gpu-check-files" / "overhead" / "aam" / "bench.json").read_text())
    assert set(data["ms_per_step"]) == modes and all(v > 0 for v in data["ms_per_step"].values())
    assert data["device"].startswith("cpu") and data["model"] == "aam" and data["config"]["token_limit"] == 24
    assert all(len(v) == 1 for v in data["samples_ms"].values())
    run = items["run_overhead"]["figures"]["tiny"]
    assert run["plain_ms"] > 0 and run["run_ms"] > 0 and len(run["pairs"]) == 1


def test_budget_stops_cleanly_and_lists_what_did_not_run(tmp_path):
    """Stopped cleanly: exit 0 within the timeout, the JSON and the table written, and what the budget left out
    said so (demo_job alone would take minutes). Run with the default --out, the current folder (not the
    repository's)."""
    proc = subprocess.run([sys.executable, SCRIPT, "--device", "cpu", "--quick", "--budget-s", "8", "--only",
                           "watch_syncs,demo_job,overhead"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    report = json.loads((tmp_path / "gpu-check.json").read_text())
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    items = {i["name"]: i for i in report["items"]}
    assert list(items) == ["watch_syncs", "demo_job", "overhead"]
    assert items["watch_syncs"]["status"] == "pass"  # started inside the budget
    for name in ("demo_job", "overhead"):
        assert items[name]["status"] == "not run" and items[name]["reason"].startswith("budget"), items[name]
    assert report["counts"]["fail"] == 0 and (tmp_path / "gpu-check.md").exists()
