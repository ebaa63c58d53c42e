"""The built-in model's sizes at given settings: its largest activations per layer, the memory its attention
probabilities need at least (refused before any data is read when the device cannot give it), and what to lower
when it ran out of memory. Shapes: B = --batch-size, A = --token-limit ASV slots, L = 151 positions, H heads."""

from __future__ import annotations

import math
import re

import torch

from debug_nan.aam.data.tokens import ASV_LEN
from debug_nan.errors import InputError
from debug_nan.process.memory import available_bytes, size_text
from debug_nan.aam.settings import AAMSettings

UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "KB": 1e3, "MB": 1e6, "GB": 1e9}


def _bytes(text: str) -> float | None:
    m = re.fullmatch(r"([\d.]+) ?(\w+)", text.strip())
    return float(m.group(1)) * UNITS[m.group(2)] if m and m.group(2) in UNITS else None


def _size(n: float) -> str:
    return size_text(n, 2)


def builtin_model_sizes(aam: AAMSettings, precision: str) -> list[tuple[str, float, str]]:
    """(what, bytes per layer, how to shrink it) for the built-in model's largest activations at these settings
    (`precision`: --precision)."""
    s = aam.model
    item = 2 if precision in ("bf16", "fp16") else 4
    b, a, h, d, n = aam.data.batch_size, aam.data.token_limit, s.heads, s.d_model, ASV_LEN
    rows = b * a if not s.asv_chunk_size else min(s.asv_chunk_size, b * a)
    encoder = f"batch {b} x token limit {a}" if not s.asv_chunk_size else f"--asv-chunk-size {s.asv_chunk_size}"
    return [
        (f"ASV encoder attention scores [{encoder} ASVs x {h} heads x {n} x {n}]", rows * h * n * n * item,
         "--asv-chunk-size bounds it" if not s.asv_chunk_size else "a smaller --asv-chunk-size shrinks it"),
        (f"ASV encoder activations [{encoder} ASVs x {n} x d_model {d}]", rows * n * d * item,
         "--asv-chunk-size bounds it" if not s.asv_chunk_size else "a smaller --asv-chunk-size shrinks it"),
        (f"sample-level attention scores [batch {b} x {h} heads x token limit {a} x {a}]", b * h * a * a * item,
         "it grows with the square of --token-limit; --asv-chunk-size does not change it"),
    ]


def attention_probability_bytes(aam: AAMSettings, precision: str) -> int:
    """The lower bound check_activation_memory refuses on: the built-in model's attention probabilities of one
    micro-batch, every layer (scripts/gpu_check.py sizes a real out-of-memory just under it)."""
    asv, _, sample = builtin_model_sizes(aam, precision)
    s = aam.model
    copies = 2 if s.dropout > 0 else 1  # softmax keeps its output; dropout keeps what it passes on
    return int(copies * (asv[1] * s.asv_layers + sample[1] * (s.sample_layers + s.encoder_layers)))


def check_activation_memory(aam: AAMSettings, precision: str, device: torch.device) -> None:
    """Before any data is read: the built-in model's attention probabilities alone (saved for the backward: the
    softmax's output per layer, and dropout's) must fit in the memory the device can give, else exit 2 naming
    --token-limit (the kernel would kill the run without a word). A lower bound, so a run this refuses could never
    have trained: --token-limit 300 on 12 samples (bound 2.6 GB) peaked at 8.4 GB RSS on CPU."""
    asv, _, sample = builtin_model_sizes(aam, precision)
    s, data = aam.model, aam.data
    copies = 2 if s.dropout > 0 else 1
    need = attention_probability_bytes(aam, precision)
    if device.type == "cuda":
        available, where = torch.cuda.mem_get_info(device)[0], str(device)
    else:
        available, where = available_bytes(), "this machine's memory"
    if available is None or need <= available:
        return
    chunk = "" if s.asv_chunk_size else ", or bound the ASV encoder with --asv-chunk-size (e.g. 512)"
    raise InputError(
        f"--token-limit {data.token_limit}: the built-in model would hold at least {_size(need)} of attention "
        f"probabilities for one micro-batch ({asv[0]}: {_size(asv[1])} x {s.asv_layers} layer(s); {sample[0]}: "
        f"{_size(sample[1])} x {s.sample_layers + s.encoder_layers} layer(s)"
        f"{'; twice: softmax and dropout keep one each' if copies == 2 else ''}), more than the {_size(available)} "
        f"{where} can give now. Lower --token-limit (or --batch-size){chunk}.")


def oom_advice(aam: AAMSettings, precision: str, failed: str | None) -> str:
    """The built-in model's part of an out-of-memory message: its largest activations at these settings, which
    one the failed allocation (`failed`, e.g. "2.00 GiB") matches, and which option lowers which."""
    sizes = builtin_model_sizes(aam, precision)
    s, data = aam.model, aam.data
    listed = "; ".join(f"{what} = {_size(n)} per layer ({how})" for what, n, how in sizes)
    wanted = _bytes(failed) if failed else None
    match = ""
    if wanted:
        what, n, _ = min(sizes, key=lambda row: abs(math.log(max(row[1], 1) / wanted)))
        if 0.5 <= n / wanted <= 2:
            match = f" The failed allocation is the size of the {what.split(' [')[0]}."
    lower = [f"--token-limit (now {data.token_limit})"]
    if data.batch_size > 2:
        lower.append(f"--batch-size (now {data.batch_size}; 2 is the smallest, UniFrac needs pairs)")
    advice = (f"lower {' or '.join(lower)}" + ("" if s.asv_chunk_size else ", or bound the ASV encoder with "
                                               "--asv-chunk-size (e.g. 512)"))
    if data.batch_size <= 2 and s.asv_chunk_size:
        advice += f" or a smaller --asv-chunk-size (now {s.asv_chunk_size})"
    return f"At these settings the built-in model holds: {listed}.{match} To fit, {advice}."
