"""The in-process items of scripts/gpu_check.py: the host syncs of a watched micro-batch counted on the device, and
fused attention with an all-masked row through the Monitor. Each is item(check, item) -> None (gpu_check.Item)."""

from __future__ import annotations

import collections
import io
import itertools
import traceback
import warnings

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

NO_CUDA = "skipped (no CUDA)"


class CudaSyncs:
    """Every synchronizing CUDA call while active, as torch.cuda.set_sync_debug_mode("warn") reports it, with the
    innermost frame outside torch that made it (a no-op without CUDA: `where` stays None)."""

    def __init__(self, cuda: bool):
        self.cuda, self.where = cuda, None if not cuda else []

    def __enter__(self):
        if self.cuda:
            self._caught = warnings.catch_warnings()
            self._caught.__enter__()
            warnings.simplefilter("always")
            warnings.showwarning = self._seen
            torch.cuda.set_sync_debug_mode("warn")
        return self

    def _seen(self, message, category, filename, lineno, file=None, line=None):
        if "synchroniz" not in str(message).lower():
            return
        frames = [f for f in traceback.extract_stack()[:-1] if "/torch/" not in f.filename
                  and not f.filename.endswith("warnings.py")]
        where = frames[-1] if frames else None  # the code that asked torch for it: debug-nan's, or the loop's
        self.where.append(f"{'/'.join(where.filename.split('/')[-2:])}:{where.lineno} {where.name}"
                          if where else f"{filename}:{lineno}")

    def __exit__(self, *exc):
        if self.cuda:
            torch.cuda.set_sync_debug_mode(0)
            self._caught.__exit__(*exc)


def watch_syncs(check, item) -> None:
    """Host syncs per micro-batch of the Watch (3 micro-batches a step), the Monitor and the Trainer (accumulation
    1 and 3), on the device, after 2 warm-up steps, against the same loop without debug-nan (its own uploads).
    Counted twice: by the unit tests' dispatch counter (item(), bool(), .cpu(), .tolist()) and, on CUDA, by
    set_sync_debug_mode("warn") (which also sees pageable copies and stream waits), each listed by where."""
    from bench_overhead import plain_step

    from debug_nan import Monitor
    from debug_nan.drivers.task import Task
    from debug_nan.drivers.trainer.loop import Trainer
    from debug_nan.engine.stats import move_to
    from debug_nan.engine.watch.watch import Watch
    from debug_nan.presentation.log import Log
    from debug_nan.app.job_settings import build_settings
    from tests.unit.engine.watch.test_watch_syncs import HostSyncs, batches, model_without_syncs, mse

    device = torch.device(check.device)
    on_device = [move_to(b, device) for b in batches(3)]

    def fresh():  # SGD: the CPU's AdamW reads its step counter (.item()), which is not the watch's
        model = model_without_syncs().to(device)
        return model, torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)

    def trainer(accumulation: int) -> Trainer:
        task = Task(model=model_without_syncs(), batches=batches(3), loss=mse,
                    optimizer=lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9))
        settings = build_settings(None, {"device": check.device, "gradient_accumulation_steps": accumulation})
        return Trainer(task, settings, Log(stream=io.StringIO()), device)

    def counted(step, steps: int = 2, warm: int = 2) -> tuple[int, list[str] | None]:
        for _ in range(warm):
            step()
        with CudaSyncs(check.cuda) as cuda, HostSyncs() as host:
            for _ in range(steps):
                step()
        return host.count, cuda.where

    model, optimizer = fresh()
    watch = Watch(model, optimizer)

    def watched_micro_batches():
        optimizer.zero_grad(set_to_none=True)
        for batch in on_device:
            watch.watch_batch(batch)
            loss = mse(model, batch)
            watch.watch_loss(loss)
            (loss / 3).backward()
            watch.watch_grads()
            watch.sync()
        optimizer.step()
        watch.watch_params()

    model2, optimizer2 = fresh()
    monitor = Monitor(model2, mse, optimizer2)

    def monitored():
        with monitor.step(on_device[0]) as step:
            loss = mse(model2, on_device[0])
            step.watch_loss(loss)
            loss.backward()
        optimizer2.step()
        optimizer2.zero_grad()

    rows = {"Watch": (watched_micro_batches, 3), "Monitor": (monitored, 1)}
    for accumulation in (1, 3):
        t, stream, steps = trainer(accumulation), itertools.cycle(batches(3)), itertools.count(1)
        rows[f"Trainer (accumulation {accumulation})"] = (lambda t=t, s=stream, n=steps: t.train_step(next(n), s),
                                                          accumulation)
    unwatched = trainer(1)
    unwatched.watch.close()
    plain = counted(lambda: plain_step(unwatched, batches(1)[0]))  # the loop's own syncs: a CPU batch uploaded
    rows_out = {}
    for name, (step, micro) in rows.items():
        try:
            host, cuda = counted(step)
        except Exception as exc:  # noqa: BLE001 - one entry point's failure leaves the others to be counted
            item.expect(False, f"{name}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        own_cuda = None if cuda is None else len(cuda) / (2 * micro) - (
            len(plain[1]) / 2 if name.startswith("Trainer") else 0)
        rows_out[name] = {"dispatch_counter_per_micro_batch": host / (2 * micro),
                          "cuda_syncs_per_micro_batch": NO_CUDA if cuda is None else len(cuda) / (2 * micro),
                          "cuda_syncs_of_the_watch_per_micro_batch": NO_CUDA if cuda is None else own_cuda,
                          "cuda_syncs_where": NO_CUDA if cuda is None else dict(collections.Counter(cuda))}
        item.expect(host == 2 * micro, f"{name}: {host / (2 * micro):g} reads per micro-batch by the dispatch counter")
        if cuda is not None:
            item.expect(own_cuda == 1, f"{name}: {own_cuda:g} CUDA syncs of its own per micro-batch "
                                       f"({dict(collections.Counter(cuda))})")
    monitor.close()
    item.figures = {"entry_points": rows_out, "plain_loop_cuda_syncs_per_step":
                    NO_CUDA if plain[1] is None else {"count": len(plain[1]) / 2,
                                                      "where": dict(collections.Counter(plain[1]))}}
    item.summary = ", ".join(f"{k} {v['dispatch_counter_per_micro_batch']:g}"
                             + ("" if not check.cuda else f" ({v['cuda_syncs_of_the_watch_per_micro_batch']:g} CUDA)")
                             for k, v in rows_out.items()) + " per micro-batch" + ("" if check.cuda else
                                                                                   "; CUDA counter " + NO_CUDA)


class Kernels(TorchDispatchMode):
    """The attention kernels that ran while active."""

    def __init__(self):
        super().__init__()
        self.seen: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if "attention" in str(func) and str(func) not in self.seen:
            self.seen.append(str(func))
        return func(*args, **(kwargs or {}))


class MaskedAttention(nn.Module):
    """Self-attention through F.scaled_dot_product_attention on one SDPA backend, with a mask that leaves some
    query rows no key: `flash` a lower-right causal bias over 16 queries and 8 keys (what the CUDA flash kernel
    takes: queries 0..7 see no key), `efficient` a boolean mask (query 2 of sample 1 sees none)."""

    def __init__(self, backend: str, cuda: bool):
        super().__init__()
        self.backend, self.cuda = backend, cuda
        self.qkv, self.out = nn.Linear(16, 48), nn.Linear(16, 16)
        from torch.nn.attention.bias import causal_lower_right

        # made here: a tensor subclass cannot be created under a dispatch mode (the replay's tracer is one)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # (that such rows may be NaN: what this probes)
            self.causal = causal_lower_right(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        b, length, _ = x.shape
        # the fused CUDA kernels take half precision (flash only that): bf16 autocast, as a user's run has it
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.cuda):
            q, k, v = self.qkv(x).view(b, length, 3, 2, 8).permute(2, 0, 3, 1, 4)
            if self.backend == "flash":
                k, v, mask = k[:, :, :8], v[:, :, :8], self.causal
            else:
                mask = torch.ones(b, 1, length, length, dtype=torch.bool, device=x.device)
                mask[1, :, 2] = False
            kernel = SDPBackend.FLASH_ATTENTION if self.backend == "flash" else SDPBackend.EFFICIENT_ATTENTION
            with sdpa_kernel([kernel]):
                y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
            return self.out(y.transpose(1, 2).reshape(b, length, 16)).float()


def attention_loss(model, batch):
    return model(batch["x"]).square().mean()


def masked_attention(backend: str, check) -> dict:
    """The kernel's own output and gradients (NaN or not), then the Monitor's finding on the same model."""
    from debug_nan import Monitor, NonFiniteError

    device = torch.device(check.device)
    batch = {"x": torch.randn(2, 16, 16, generator=torch.Generator().manual_seed(0)).to(device)}

    def fresh():
        torch.manual_seed(0)
        return MaskedAttention(backend, check.cuda).to(device)

    probe = fresh()
    with Kernels() as kernels:
        out = probe(batch["x"])
        out.square().mean().backward()
    row = {"kernels": kernels.seen, "output_nonfinite": not bool(torch.isfinite(out).all()),
           "gradients_nonfinite": not all(bool(torch.isfinite(p.grad).all()) for p in probe.parameters())}
    model = fresh()
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2)
    monitor = Monitor(model, attention_loss, optimizer)
    try:
        with monitor.step(batch) as step:
            loss = attention_loss(model, batch)
            step.watch_loss(loss)
            loss.backward()
        optimizer.step()
        row["finding"] = None
    except NonFiniteError as exc:
        f = exc.finding
        row["finding"] = {"phase": f.phase, "op": f.op, "cause": f.cause, "module": f.module}
    finally:
        monitor.close()
    return row


def all_masked_sdpa(check, item) -> None:
    """An all-masked row through F.scaled_dot_product_attention on the flash and memory-efficient backends: where
    the kernel makes a NaN (output or gradients), the Monitor must name all_masked_softmax; where it gives such
    rows finite values (flash-attn documents zeros), there is nothing to find and the step must stay clean."""
    said = []
    for backend in ("flash", "efficient"):
        if backend == "efficient" and not check.cuda:
            item.figures[backend] = NO_CUDA  # torch has no memory-efficient kernel on the CPU
            said.append(f"{backend} {NO_CUDA}")
            continue
        try:
            row = item.figures[backend] = masked_attention(backend, check)
        except Exception as exc:  # noqa: BLE001 - one backend's failure leaves the other to run
            item.expect(False, f"{backend}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        item.expect(any(backend in k for k in row["kernels"]), f"{backend}: the backend did not run ({row['kernels']})")
        made_nan = row["output_nonfinite"] or row["gradients_nonfinite"]
        found = row["finding"]
        if made_nan:
            item.expect(found is not None and found["cause"] == "all_masked_softmax",
                        f"{backend}: the kernel made a NaN and the Monitor found {found}")
            said.append(f"{backend}: NaN -> {found['cause'] if found else 'nothing'}")
        else:
            item.expect(found is None, f"{backend}: the kernel stayed finite and the Monitor found {found}")
            said.append(f"{backend}: finite rows (no NaN), clean")
    item.summary = "; ".join(said)


def encoder_fast_path_nan(device: str) -> bool:
    """Does nn.TransformerEncoder's inference fast path (eval, no_grad, pre-norm: no nested tensors) give NaN for
    a sample whose every key is padding?"""
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.1, batch_first=True, norm_first=True)
    encoder = nn.TransformerEncoder(layer, 1, enable_nested_tensor=False).to(device).eval()
    padding = torch.zeros(2, 6, dtype=torch.bool, device=device)
    padding[1] = True
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (torch's notes on the fast path)
        out = encoder(torch.randn(2, 6, 16, device=device), src_key_padding_mask=padding)
    return not bool(torch.isfinite(out).all())
