"""`debug-nan run -- COMMAND`: the user's own script, unmodified, driven from outside.

hooks.py (torch's global hooks: the root forward, each backward, each optimizer step, GradScaler, LR schedulers,
the process group's end) cut the run into micro-batches and steps, their state in one object (hook_state.py: where
the script is in a micro-batch, what is watched, what stepped); model_calls.py (which module is the model,
what its call gives, what its modules and hooks keep; the wrappers around it and its optimizer, and the script's
step line found through them: drivers/wrappers.py); optimizers.py (which models and optimizers are watched,
a replacing one followed); ensemble.py (several models and optimizers, or bare parameters, as the one model and
optimizer the session reads); tape.py + recorder.py (the script's code between the model and the backward, recorded
for the in-place replay; functions.py: a custom autograd Function there, one entry); replayer.py (the tape replay,
shared with the bundle's driver); driver.py (RunDriver: the FrameworkDriver
whose replay calls the tapes); bundle.py (a finding's repro bundle: the script's objects, and its replay); stops.py
(stopping the script from a hook, in any thread); ranks.py (under torchrun: the rank's agreement through the
script's own process group).
"""
