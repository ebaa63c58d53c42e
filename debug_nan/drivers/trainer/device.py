"""Which device the run uses: --device auto / cpu / cuda / cuda:N, checked before any work is done."""

from __future__ import annotations

import torch

from debug_nan.errors import InputError


def resolve_device(spec: str, log) -> torch.device:
    """auto -> CUDA when available, else CPU (with a notice); cuda / cuda:N must exist."""
    if spec == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        log("NOTICE: no CUDA device is available; running on the CPU (use --device cuda on a GPU node).")
        return torch.device("cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise InputError(f"--device {spec!r} is not a device: use auto, cpu, cuda or cuda:N.") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise InputError(f"--device {spec}: this machine has no usable CUDA device (torch "
                             f"{torch.__version__}, CUDA build: {torch.version.cuda or 'no'}). Use --device cpu or "
                             "auto.")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise InputError(f"--device {spec}: only {torch.cuda.device_count()} CUDA device(s) are visible.")
    elif device.type != "cpu":
        raise InputError(f"--device {spec}: only cpu and cuda devices are supported.")
    return device
