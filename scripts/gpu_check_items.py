"""The items of scripts/gpu_check.py that run commands (the CLI, pytest, the benchmark scripts), and the three lists
gpu_check runs: IN_PROCESS (first, one at a time), POOLED (--jobs at a time), ALONE (last, one at a time). Each
item is item(check, item) -> None: it runs its commands with check.run, keeps figures, and says what it expected
with item.expect."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from gpu_check_launchers import launchers
from gpu_check_precision import mixed_precision
from gpu_check_probes import NO_CUDA, all_masked_sdpa, encoder_fast_path_nan, watch_syncs

REPO = Path(__file__).resolve().parents[1]
CUDA_TESTS = [  # every test that skips without CUDA (none may skip on a GPU: tests/unit/scripts/test_gpu_check_items.py
    # keeps this list whole), the diagnosis of the fused CUDA kernel's mask, and the watch's sync tests
    "tests/unit/engine/replay/test_snapshot_modes.py::test_cuda_round_trip_and_where_the_copies_live",
    "tests/unit/engine/replay/test_snapshot_modes.py::test_cuda_host_save_does_not_wait_for_the_copy",
    "tests/unit/engine/replay/test_snapshot_modes.py::test_cuda_host_without_an_optimizer_copies_in_stream_order",
    "tests/e2e/frameworks/test_hf.py::test_fp16_scaler_overflow_is_not_a_finding_on_cuda",
    "tests/unit/engine/explain/test_diagnose.py::test_sdpa_cuda_kernel_reads_attn_bias",
    "tests/unit/engine/watch/test_watch_syncs.py",
    # Lightning's and Accelerate's FSDP under `torchrun -m debug_nan run` (2 GPUs where there are, else 1)
    "tests/e2e/ddp/test_run_sharded_frameworks.py::test_a_healthy_sharded_framework_run_prints_exactly_its_own_output",
    "tests/e2e/ddp/test_run_sharded_frameworks.py::test_a_nan_born_on_rank_1_is_named_on_rank_1_at_its_op",
]


def report_of(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() and path.stat().st_size else {}


def finding_of(report: dict) -> dict:
    first = report.get("first_nonfinite") or {}
    return {k: first.get(k) for k in ("step", "phase", "module", "op", "cause")}


def cli_run(check, item, name: str, args: list[str], cwd: Path = REPO) -> tuple[int, dict, str]:
    """`python -m debug_nan ARGS --report R` -> (exit code, the JSON report, the output)."""
    report = check.folder(item, name) / "report.json"
    done = check.run(item, ["-m", "debug_nan", *args, "--report", report], cwd=cwd)
    return done.rc, report_of(report), done.out


def bench(check, item, name: str, args: list) -> dict | None:
    """`python SCRIPT ARGS --json J` (a benchmark of scripts/) -> its JSON, or None with the failure expected."""
    out = check.folder(item, name) / "bench.json"
    done = check.run(item, [*args, "--json", out])
    if item.expect(done.rc == 0 and out.exists(), f"{name}: exit {done.rc}: {tail_line(done.out)}"):
        return json.loads(out.read_text())
    return None


def cuda_tests(check, item) -> None:
    """The CUDA-only tests; --quick on the CPU collects them only (they skip there, and the main suite runs the
    watch's sync tests): every test id of the list still names a test."""
    collect = ["--collect-only"] if check.quick and not check.cuda else []
    done = check.run(item, ["-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *collect, *CUDA_TESTS])
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?|tests? collected)\b",
                                                tail_line(done.out))}
    item.figures = {"counts": counts, "skipped_reasons": re.findall(r"SKIPPED \[\d+\] (.*)", done.out)}
    ran = sum(n for k, n in counts.items() if k in ("passed", "tests collected"))
    item.expect(done.rc == 0 and ran > 0, f"pytest exit {done.rc}: {tail_line(done.out)}")
    if check.cuda:
        item.expect(not counts.get("skipped"), f"{counts.get('skipped')} test(s) skipped on CUDA")
    item.summary = ", ".join(f"{n} {k}" for k, n in counts.items()) + ("" if check.cuda else f" ({NO_CUDA})")


def tail_line(out: str) -> str:
    lines = [line for line in out.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def demo_job(check, item) -> None:
    """The README's main job on the demo data: clean with guards, pinpointed with --no-guards, in fp32, bf16 and
    fp16 (--quick: configs/tiny.toml, 2 steps; --quick on the CPU: fp32 alone, the code path is the same and the
    CPU's bf16 and fp16 runs are the CLI tests', tests/e2e/cli/test_cli.py)."""
    steps = 2 if check.quick else 10
    base = (["--config", "configs/tiny.toml"] if check.quick else ["--token-limit", "512"]) + [
        "--max-steps", str(steps), "--device", check.device]
    precisions = ("fp32",) if check.quick and not check.cuda else ("fp32", "bf16", "fp16")
    runs = [(check, item, f"{precision}{'' if guards else '-no-guards'}",
             base + ([] if precision == "fp32" else ["--precision", precision]) + ([] if guards else ["--no-guards"]))
            for precision in precisions for guards in (True, False)]
    said = []
    for (_, _, name, _), (rc, report, out) in zip(runs, check.map(cli_run, runs)):
        peaks = [s.get("peak_memory_mb") for s in report.get("history", []) if s.get("peak_memory_mb")]
        found = finding_of(report)
        item.figures[name] = {"exit": rc, "status": report.get("status"), "steps_run": report.get("steps_run"),
                              **found, "elapsed_s": report.get("elapsed_s"),
                              "peak_cuda_mib": max(peaks) if peaks else (None if check.cuda else NO_CUDA)}
        why = report.get("error") or tail_line(out)
        if name.endswith("no-guards"):
            item.expect(rc == 1 and found["cause"] == "all_masked_softmax",
                        f"{name}: exit {rc}, cause {found['cause']}: {why}")
            said.append(f"{name} exit {rc} {found['cause']}")
        else:
            item.expect(rc == 0 and report.get("steps_run") == steps,
                        f"{name}: exit {rc}, {report.get('steps_run')} steps: {why}")
            said.append(f"{name} exit {rc}")
    item.summary = ", ".join(said)


def all_masked_encoder(check, item) -> None:
    """PYT-8.9 as it happened (README): nn.TransformerEncoder's inference fast path in the eval pass. Where the
    fast path itself gives an all-padding row NaN (probed alone), the run must name all_masked_softmax."""
    nan = item.figures["fast_path_alone_gives_nan"] = encoder_fast_path_nan(check.device)
    rc, report, out = cli_run(check, item, "run", ["--config", REPO / "configs" / "tiny.toml", "--asv-encoder", "torch",
                                                    "--no-guards", "--eval-every", "2", "--max-steps", "4",
                                                    "--device", check.device, "--no-bundle"],
                                 cwd=check.folder(item, "empty"))  # no ./data there: synthetic data, as the README's
    found = item.figures["finding"] = finding_of(report)
    item.figures["exit"] = rc
    if rc == 1:
        item.expect(found["cause"] == "all_masked_softmax", f"exit 1, cause {found['cause']}")
        item.summary = f"exit 1: {found['cause']} in {found['phase']} ({found['op']})"
    else:
        item.expect(rc == 0 and not nan, f"exit {rc} (fast path alone gives NaN: {nan}): "
                                          f"{report.get('error') or tail_line(out)}")
        item.summary = f"exit {rc}: no NaN (the fast path gave the all-padding rows finite values)"


GPT_SCRIPT = '''"""A small GPT trained by a plain loop (scripts/gpu_check.py runs it under `debug-nan run`): token and
position embeddings (whose backward on CUDA may add with atomics: not bit for bit reproducible), and at step 3 the
logits divided by a temperature of 0 (the planted bug)."""
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, {scripts!r})
from bench_models import LMShape, TinyGPT

device = sys.argv[1]
shape = LMShape(blocks=2, d_model=64, heads=4, seq=32, batch=8, vocab=512)
torch.manual_seed(0)
model = TinyGPT(shape, dropout=0.1).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(0)
for step in range(1, 6):
    tokens = torch.randint(0, shape.vocab, (shape.batch, shape.seq + 1), generator=g).to(device)
    temperature = 0.0 if step == 3 else 1.0
    logits = model(tokens[:, :-1]) / temperature
    loss = F.cross_entropy(logits.reshape(-1, shape.vocab), tokens[:, 1:].reshape(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    print(f"step {{step}} loss {{loss.item():.4f}}")
'''


def gpt_run(check, item) -> None:
    """`debug-nan run` (no --deterministic) on a small GPT with embeddings: the op of the planted bug is named."""
    folder = check.folder(item, "script")
    (folder / "tiny_gpt.py").write_text(GPT_SCRIPT.format(scripts=str(REPO / "scripts")))
    report = folder / "report.json"
    done = check.run(item, ["-m", "debug_nan", "run", "--report", report, "--", "python", "tiny_gpt.py",
                            check.device], cwd=folder)
    found = finding_of(report_of(report))
    item.figures = {"exit": done.rc, **found, "not_deterministic": "not deterministic" in done.out}
    item.expect(done.rc == 1 and found["op"] == "aten.div.Tensor" and found["step"] == 3,
                f"exit {done.rc}, finding {found}: {tail_line(done.out)}")
    item.summary = f"exit {done.rc}: step {found['step']} {found['op']} ({found['cause']})"


def oom_sizes(free_bytes: int, token_limit: int = 1024) -> tuple[int, int, int]:
    """(token limit, batch size, bound) of a run that passes the activation check (its bound, the attention
    probabilities, about 0.7 of the free memory) but cannot fit: without dropout the bound counts them once,
    while the run also holds every layer's other activations (about twice the bound on the guarded model)."""
    from debug_nan.aam.sizes import attention_probability_bytes
    from debug_nan.app.job_settings import build_settings

    for batch in range(2, 4096, 2):
        settings = build_settings(None, {"token_limit": token_limit, "batch_size": batch, "dropout": 0.0})
        need = attention_probability_bytes(settings.aam, settings.train.precision)
        if need >= 0.7 * free_bytes:
            return token_limit, batch, need
    raise ValueError(f"no batch size reaches 0.7 of {free_bytes} bytes")


def oom(check, item) -> None:
    """A real CUDA out-of-memory on synthetic data: exit 2, the message naming the sizes in use."""
    if not check.cuda:
        return item.skip(f"{NO_CUDA}: on the CPU the kernel would kill the run, as the activation check says")
    import torch

    torch.cuda.empty_cache()  # (this process's own blocks: the run is a child)
    free = torch.cuda.mem_get_info(torch.device(check.device))[0] - 2**30  # the child's context, roughly
    limit, batch, need = oom_sizes(free)
    rc, report, out = cli_run(check, item, "run", [
        "--token-limit", str(limit), "--batch-size", str(batch), "--synthetic-samples", str(2 * batch),
        "--dropout", "0", "--max-steps", "1", "--device", check.device, "--no-bundle"],
        cwd=check.folder(item, "empty"))  # no ./data there: synthetic data
    error = report.get("error") or tail_line(out)
    item.figures = {"token_limit": limit, "batch_size": batch, "bound_gib": round(need / 2**30, 1),
                    "free_gib": round(free / 2**30, 1), "exit": rc, "message": error}
    item.expect(rc == 2 and "CUDA ran out of memory" in error, f"exit {rc}: {error}")
    item.expect(f"batch {batch} x token limit {limit}" in error, f"the message names no sizes: {error}")
    item.summary = f"exit {rc} at --token-limit {limit} --batch-size {batch}: " + error[:160]


def memory(check, item) -> None:
    """Peak memory watched vs plain, each --snapshot mode (scripts/bench_memory.py, each run its own process)."""
    runs = ([("aam-tiny", "plain,host")] if check.quick  # (the GPT sizes in the full check only)
            else [("aam", "plain,host,device,params,off"), ("100m", "plain,host,device,params,off")])
    said = []
    for size, modes in runs:
        data = bench(check, item, size, ["scripts/bench_memory.py", "--device", check.device, "--sizes", size,
                                         "--modes", modes, "--steps", "2" if check.quick else "3"])
        if data is None:
            continue
        rows = {r["mode"]: r for r in data["results"]}
        key = "cuda_max_allocated_mb" if check.cuda else "peak_rss_mb"
        item.figures[size] = {"parameters": rows["plain"]["params"], "measure": key, **{
            m: {"mb": round(r[key]), "x_plain": round(r[key] / rows["plain"][key], 2),
                "cuda_max_allocated_mb": r["cuda_max_allocated_mb"] if check.cuda else NO_CUDA}
            for m, r in rows.items()}}
        said.append(f"{size} ({rows['plain']['params'] / 1e6:.3g}M parameters): " + ", ".join(
            f"{m} {item.figures[size][m]['x_plain']:.2f}x" for m in rows if m != "plain"))
    item.summary = ("CUDA max allocated vs plain: " if check.cuda else f"peak RSS vs plain (CUDA {NO_CUDA}): ") + \
        "; ".join(said)


def overhead(check, item) -> None:
    """watch / Monitor / trace / detect_anomaly ratios to a plain step, modes side by side in one process per shape,
    order rotated (scripts/bench_overhead.py)."""
    shapes = ([("aam", ["--config", "configs/tiny.toml"])] if check.quick  # (the presets: tests/unit/scripts/)
              else [("aam", ["--config", "configs/aam.toml"]), ("deep", []), ("gpt2", [])])
    said = []
    for model, extra in shapes:
        # (--quick, the CPU suite's smoke run: bench_overhead.py's own default, its every mode, once each)
        modes = [] if check.quick else ["--modes", "plain,watch,monitor,trace,detect_anomaly"]
        data = bench(check, item, model, ["scripts/bench_overhead.py", "--device", check.device, "--model", model,
                                          *extra, *modes, "--repeats", "1" if check.quick else "3", "--warmup",
                                          "0" if check.quick else "1"])
        if data is None:
            continue
        ratio = {m: round(r, 3) for m, r in data["ratio_to_plain"].items()}
        syncs = data["host_syncs_per_watch_step"]
        item.figures[model] = {"plain_ms": round(data["ms_per_step"]["plain"], 1), "ratio_to_plain": ratio,
                               "host_syncs_per_watch_step": NO_CUDA if syncs is None else syncs}
        said.append(f"{model} ({data['ms_per_step']['plain']:.0f} ms): " + ", ".join(
            f"{m} {r:.2f}x" for m, r in ratio.items() if m != "plain"))
    item.summary = "; ".join(said)


def run_overhead(check, item) -> None:
    """`debug-nan run` against the same script plain, fresh processes in alternating pairs (scripts/bench_run.py)."""
    said = []
    for model in (["tiny"] if check.quick else ["deep", "gpt2"]):
        sizes = ["--repeats", "1", "--steps", "3", "--warmup", "2"] if check.quick else [
            "--repeats", "2", "--steps", "20", "--warmup", "16"]
        data = bench(check, item, model, ["scripts/bench_run.py", "--model", model, "--device", check.device, *sizes])
        if data is None:
            continue
        item.figures[model] = {k: data[k] for k in ("plain_ms", "run_ms", "ratio", "cpu_ratio", "pairs")}
        said.append(f"{model}: {data['plain_ms']:.1f} -> {data['run_ms']:.1f} ms/step, {data['ratio']:.2f}x")
    item.summary = "; ".join(said)


def fsdp2_run(check, item) -> None:
    """`torchrun -m debug_nan run` on an FSDP2 (`fully_shard`) script, NCCL on CUDA (one GPU per rank, up to 2),
    gloo on the CPU: a healthy run prints exactly its own output, a learning rate of 1e30 is named with its step,
    phase, module, op and rank."""
    import torch

    ranks = min(2, torch.cuda.device_count()) if check.cuda else 2
    script = str(REPO / "tests" / "support" / "run" / "shard_script.py")
    torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    device = "cuda" if check.cuda else "cpu"
    healthy_exit = "not run (--quick on the CPU: tests/e2e/ddp/test_run_sharded.py runs it)"
    if check.cuda or not check.quick:  # (3 torchrun jobs cost the CPU suite half a minute: the broken one is kept)
        plain = check.run(item, [*torchrun, script, "--shard", "fsdp2", "--device", device])
        healthy = check.folder(item, "healthy") / "report.json"
        watched = check.run(item, [*torchrun, "-m", "debug_nan", "run", "--report", healthy, "--", script,
                                   "--shard", "fsdp2", "--device", device])
        steps = [line for line in watched.out.splitlines() if line.startswith("step ")]
        item.expect(plain.rc == 0 and watched.rc == 0 and report_of(healthy).get("status") == "clean"
                    and steps == [ln for ln in plain.out.splitlines() if ln.startswith("step ")] and len(steps) == 4,
                    f"healthy: plain exit {plain.rc}, watched exit {watched.rc}: {tail_line(watched.out)}")
        healthy_exit = watched.rc
    broken = check.folder(item, "lr") / "report.json"
    done = check.run(item, [*torchrun, "-m", "debug_nan", "run", "--report", broken, "--", script,
                            "--shard", "fsdp2", "--bug", "lr", "--device", device])
    first = report_of(broken).get("first_nonfinite") or {}
    found = {**finding_of(report_of(broken)), "rank": first.get("rank"), "first_ranks": first.get("first_ranks")}
    item.figures = {"ranks": ranks, "backend": "nccl" if check.cuda else "gloo", "healthy_exit": healthy_exit,
                    "lr_exit": done.rc, **found}
    item.expect(done.rc != 0 and found["step"] == 2 and found["phase"] == "forward"
                and found["rank"] in (found["first_ranks"] or [])
                and (found["module"] or "").startswith("cascade_stages.") and found["cause"] == "overflow",
                f"lr 1e30: exit {done.rc}, finding {found}: {tail_line(done.out)}")
    item.summary = (f"{ranks} rank(s), {item.figures['backend']}: healthy exit {healthy_exit}; lr 1e30 -> step "
                    f"{found['step']} {found['phase']} {found['module']} {found['op']} rank {found['rank']}")


AAM_COMMIT = "6f65d20"  # github.com/jbk708/aam: its FSDP path (089f32d, test_run_aam.py's commit, predates it)


def printed(out: str) -> list[str]:
    """The lines aam_fsdp.py prints (rank 0's mean losses) among a command's output."""
    return [line for line in out.splitlines() if line.startswith("{'count_loss'")]


def aam_fsdp_run(check, item) -> None:
    """AAM's own `pretrain --fsdp` path (its wrap_model_fsdp, Trainer and gathered UniFrac loss:
    tests/support/run/aam_fsdp.py, AAM at $DEBUG_NAN_AAM_DIR) under `torchrun -m debug_nan run`, NCCL, one GPU per
    rank (up to 2): healthy, its own output and clean; a count of -1 in the last rank's step-2 batch (log(0) in AAM's
    count embedding) named on that rank, at its op."""
    aam = os.environ.get("DEBUG_NAN_AAM_DIR")
    if not check.cuda:
        return item.skip(f"{NO_CUDA}: AAM's wrap_model_fsdp refuses the CPU")
    if not aam or not Path(aam, "aam", "training", "distributed.py").is_file():
        return item.skip(f"DEBUG_NAN_AAM_DIR ({aam or 'unset'}) is not a checkout of github.com/jbk708/aam with its "
                         f"FSDP path (aam/training/distributed.py): check out {AAM_COMMIT}")
    import torch

    ranks = min(2, torch.cuda.device_count())
    script = str(REPO / "tests" / "support" / "run" / "aam_fsdp.py")
    torchrun = ["-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={ranks}"]
    plain = check.run(item, [*torchrun, script])
    healthy = check.folder(item, "healthy") / "report.json"
    watched = check.run(item, [*torchrun, "-m", "debug_nan", "run", "--report", healthy, "--", script])
    item.expect(plain.rc == 0 and watched.rc == 0 and report_of(healthy).get("status") == "clean"
                and len(printed(plain.out)) == 1 and printed(watched.out) == printed(plain.out),
                f"healthy: plain exit {plain.rc}, watched exit {watched.rc}: {tail_line(watched.out)}")
    broken = check.folder(item, "count") / "report.json"
    done = check.run(item, [*torchrun, "-m", "debug_nan", "run", "--report", broken, "--", script, "--bug", "count"])
    first = report_of(broken).get("first_nonfinite") or {}
    found = {**finding_of(report_of(broken)), **{k: first.get(k) for k in ("rank", "first_ranks", "rank_origins")}}
    item.figures = {"ranks": ranks, "aam_dir": aam, "healthy_exit": watched.rc, "count_exit": done.rc, **found}
    # log(0) is born in the last rank's forward of step 2, in AAM's SampleSequenceEncoder (`sample_encoder`); a
    # torchrun of one process is one process to debug-nan (engine/session/distributed.py detect): no rank reported
    rank_ok = found["rank"] == ranks - 1 or (ranks == 1 and found["rank"] is None)
    item.expect(done.rc != 0 and rank_ok and (found["step"], found["phase"], found["module"],
                found["op"], found["cause"]) == (2, "forward", "sample_encoder", "aten.log.default",
                                                  "log_of_nonpositive"),
                f"count -1 on rank {ranks - 1}: exit {done.rc}, finding {found}: {tail_line(done.out)}")
    item.summary = (f"{ranks} rank(s), nccl: healthy exit {watched.rc}; count -1 -> step {found['step']} "
                    f"{found['phase']} {found['module']} {found['op']} rank {found['rank']}")


IN_PROCESS = [("watch_syncs", "host syncs per watched micro-batch (promise: 1)", watch_syncs),
              ("all_masked_sdpa", "all-masked row, SDPA flash / memory-efficient -> all_masked_softmax",
               all_masked_sdpa)]
POOLED = [  # the longest first
    ("demo_job", "main job on the demo data, fp32 / bf16 / fp16, guards / --no-guards", demo_job),
    ("cuda_tests", "CUDA-only tests + watch sync tests (pytest)", cuda_tests),
    ("gpt_run", "`debug-nan run` on a small GPT with embeddings, no --deterministic", gpt_run),
    ("fsdp2_run", "`torchrun -m debug_nan run` on FSDP2 (NCCL on CUDA): clean output, lr 1e30 named", fsdp2_run),
    ("aam_fsdp_run", "AAM's own `pretrain --fsdp` path under `torchrun -m debug_nan run`: clean, rank named",
     aam_fsdp_run),
    ("launchers", "`debug-nan run -- torchrun ...` and Lightning's own DDP launcher on NCCL (2 GPUs): clean "
     "output, rank 1's overflow named", launchers),
    ("mixed_precision", "fp16 through `debug-nan run`: a real GradScaler, an fp16 overflow, SDPA flash / "
     "memory-efficient in fp16", mixed_precision),
    ("memory", "peak memory, watched vs plain, each --snapshot mode", memory),
    ("all_masked_encoder", "all-masked row, nn.TransformerEncoder fast path (eval pass)", all_masked_encoder)]
ALONE = [("oom", "a real CUDA out-of-memory: exit 2 naming the sizes", oom),
         ("overhead", "watch / Monitor / trace / detect_anomaly vs plain (--task Trainer)", overhead),
         ("run_overhead", "`debug-nan run` vs plain", run_overhead)]
