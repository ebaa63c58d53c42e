"""Drivers: each says WHEN the step session's verbs happen (its loop's or framework's hook points) and HOW its
step is replayed (the StepDriver methods). Nothing else: the checks, the replay and the diagnosis are the engine's.

task.py, recipe.py   the plug-in seam: a Task (model, batches, loss) and its Recipe (optimizer, schedule,
                     clipping); the built-in AAM task (debug_nan.aam) and every --task file implement it
session_driver.py    SessionDriver: the one driver base every entry point below is (its step session built once,
                     "loss, scale, backward" and "unscale, clip, step" written once, the replay's StepDriver)
wrappers.py          the model's and the optimizer's wrappers seen through (DDP, torch.compile, Accelerate, Lightning)
trainer/             the CLI's Trainer: the loop it runs itself (loop.py, top to bottom), checkpoints, the eval pass
monitor.py           Monitor: a user's own loop, `with monitor.step(...)`
framework.py         FrameworkDriver: the session split at a framework's hook points; lightning.py, hf.py on it
                     (public paths: debug_nan.integrations.*), framework_outputs.py (the callbacks' options and
                     outputs: their summary and report)
eval_forwards.py     the model's forwards outside training (validation, generation), checked and replayed for
                     every entry point but the CLI's Trainer (which runs its own eval pass)
run/                 `debug-nan run`: the user's unmodified script, cut into steps by torch's global hooks
                     (hooks.py), its code around the model recorded (tape.py), RunDriver (driver.py)
"""
