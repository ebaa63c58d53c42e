"""What the installed torch offers for mixed precision on the CPU (tests skip, with the reason, where it lacks it)."""

import warnings

import torch


def _cpu_fp16_autocast() -> bool:
    """Does CPU autocast run a matmul in float16? (Older torch warns that CPU autocast supports bfloat16 only, and
    runs it in float32.)"""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with torch.autocast("cpu", dtype=torch.float16):
            return (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.float16


CPU_FP16 = _cpu_fp16_autocast()
NO_CPU_FP16 = f"torch {torch.__version__} has no float16 autocast on the CPU"
