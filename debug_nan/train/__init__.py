"""Training tier: the task plug-in (what to train, with which recipe) and the loop (how: devices, accumulation,
precision, DDP), with every check on."""
