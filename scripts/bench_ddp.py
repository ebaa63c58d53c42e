"""What does the watch cost under DDP? Two gloo ranks on this machine, the same model and batches, side by side.

    python scripts/bench_ddp.py --model gpt2                 # GPT-2-like, 6 blocks, d 384 (scripts/bench_models.py)
    python scripts/bench_ddp.py --model deep --accumulate 2  # 24 narrow blocks, 2 micro-batches per step

Modes, each a full optimizer step on every rank (forward, loss, backward, gradient averaging, AdamW step):
  plain_ddp       the user's loop: the model in DistributedDataParallel, no_sync() on all micro-batches but the
                  last, whose backward DDP's reducer all-reduces bucket by bucket while it runs
  watch           debug-nan's step (Trainer.train_step under DDP): every check, the snapshot, one agreement per
                  micro-batch, and the gradients averaged during the last backward (drivers/trainer/overlap.py)
  watch_at_end    the same with the averaging after the backward (no overlap): what the watch cost before
Modes alternate within every repeat, after warm-up; a step's time is the slowest rank's (one MAX all-reduce
after a barrier-aligned step). `x plain` is the median of the per-repeat ratios to the same repeat's plain_ddp.
Each rank runs one thread (2 ranks on 2 cores); gloo runs over loopback, so the communication is cheap here and
the overlap matters far more on a real network with NCCL.
"""

from __future__ import annotations

import argparse
import io
import itertools
import json
import statistics
import sys
import tempfile
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from bench_models import PRESETS, build_lm_task  # noqa: E402

from debug_nan.drivers.trainer.loop import Trainer  # noqa: E402
from debug_nan.engine.session.distributed import DistContext  # noqa: E402
from debug_nan.engine.stats import move_to  # noqa: E402
from debug_nan.presentation.log import Log  # noqa: E402
from debug_nan.app.job_settings import build_settings  # noqa: E402

MODES = ("plain_ddp", "watch", "watch_at_end")


def plain_ddp_step(ddp, optimizer, batches, loss_fn) -> None:
    """The textbook DDP step with gradient accumulation."""
    optimizer.zero_grad(set_to_none=True)
    for i, batch in enumerate(batches):
        last = i == len(batches) - 1
        with (ddp.no_sync() if not last else _nothing()):
            (loss_fn(ddp, batch) / len(batches)).backward()
    optimizer.step()


class _nothing:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def rank_main(rank: int, args, store: str, result_path: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2,
                            timeout=timedelta(seconds=300))
    settings = build_settings(None, {"device": "cpu", "max_steps": 10**9,
                                     "gradient_accumulation_steps": args.accumulate})
    task = build_lm_task(args.model, settings.train.seed)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own micro-batches, fixed over the run
    base = task.batches[0]
    batches = [{k: v[torch.randperm(v.shape[0], generator=gen)] for k, v in base.items()}
               for _ in range(args.accumulate)]
    trainer = Trainer(task, settings, Log(stream=io.StringIO()), torch.device("cpu"), DistContext(rank, 2, rank))
    plain_model = build_lm_task(args.model, settings.train.seed).model
    plain_model.load_state_dict(trainer.model.state_dict())
    ddp = torch.nn.parallel.DistributedDataParallel(plain_model)
    plain_opt = torch.optim.AdamW(plain_model.parameters(), lr=trainer.optimizer.param_groups[0]["lr"])

    def watch_step(i: int, overlap: bool) -> None:
        trainer.log.stream.seek(0)
        trainer.log.stream.truncate()
        reducer = trainer.reducer
        learned, keep = reducer.steps > 0, reducer.overlap  # (the first step learns the order, never overlaps)
        reducer.overlap = keep and overlap if learned else keep
        try:
            finding = trainer.train_step(i + 1, itertools.cycle(batches))
        finally:
            if learned:
                reducer.overlap = keep
        assert finding is None, finding

    step_fns = {
        "plain_ddp": lambda i: plain_ddp_step(ddp, plain_opt, [move_to(b, "cpu") for b in batches], task.loss),
        "watch": lambda i: watch_step(i, True),
        "watch_at_end": lambda i: watch_step(i, False),
    }
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for rep in range(args.warmup + args.repeats):
        for mode in MODES:
            (trainer.watch.attach if mode.startswith("watch") else trainer.watch.close)()
            dist.barrier()
            start = time.perf_counter()
            step_fns[mode](rep)
            elapsed = torch.tensor(time.perf_counter() - start)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the step takes as long as its slowest rank
            if rep >= args.warmup:
                times[mode].append(elapsed.item())
    if rank == 0:
        Path(result_path).write_text(json.dumps({"samples_s": times, "buckets": len(trainer.reducer.buckets)}))
    dist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=tuple(PRESETS), default="gpt2")
    ap.add_argument("--accumulate", type=int, default=1, help="micro-batches per optimizer step")
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--json", dest="json_path")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        result_path = str(Path(tmp) / "result.json")
        mp.spawn(rank_main, args=(args, str(Path(tmp) / "store"), result_path), nprocs=2, join=True)
        result = json.loads(Path(result_path).read_text())
    times = result["samples_s"]
    ms = {m: 1000 * statistics.median(v) for m, v in times.items()}
    ratio = {m: statistics.median(a / b for a, b in zip(v, times["plain_ddp"])) for m, v in times.items()}
    print(f"2 gloo ranks on CPU, 1 thread each | model {args.model} {vars(PRESETS[args.model])} | accumulation "
          f"{args.accumulate} | {result['buckets']} gradient buckets | {args.repeats} repeats after {args.warmup} "
          f"warm-up")
    print(f"{'mode':<14}{'ms/step':>10}{'x plain':>10}   (slowest rank's wall time; x plain: median of paired ratios)")
    for m in MODES:
        print(f"{m:<14}{ms[m]:>10.1f}{ratio[m]:>10.3f}")
    if args.json_path:
        Path(args.json_path).write_text(json.dumps({
            "model": args.model, "accumulate": args.accumulate, "ms_per_step": ms, "ratio_to_plain": ratio,
            "buckets": result["buckets"], "repeats": args.repeats, "torch": torch.__version__,
            "samples_ms": {m: [1000 * x for x in v] for m, v in times.items()}}, indent=2) + "\n")
        print(f"wrote {args.json_path}")


if __name__ == "__main__":
    main()
