"""Training tier: the task plug-in (what to train) and the runner (how: devices, accumulation, precision)."""
