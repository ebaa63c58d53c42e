"""The CLI's Trainer (the driver of `debug-nan` and `--task`): loop.py reads top to bottom (autocast forward,
backward with accumulation, the DDP reducer of overlap.py, clipping, the optimizer step, the schedule, the eval
pass of evaluate.py); checkpoint.py (--checkpoint); device.py (which device, and why)."""
