"""`debug-nan run -- COMMAND`: the user's own script, unmodified, driven from outside.

hooks.py (torch's global hooks: the root forward, each backward, each optimizer step, GradScaler, LR schedulers,
the process group's end) cut the run into micro-batches and steps; model_calls.py (which module is the model,
what its call gives); optimizers.py (which optimizer is watched, a replacing one followed); tape.py (the script's
code between the model and the backward, recorded for the in-place replay); driver.py (RunDriver: the
FrameworkDriver whose replay calls the tapes); stops.py (stopping the script from a hook, in any thread);
ranks.py (under torchrun: the rank's agreement through the script's own process group).
"""
