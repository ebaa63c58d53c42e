"""debug-nan inside the training loops people already have.

    debug_nan.integrations.lightning.DebugNaNCallback  a lightning.pytorch.Callback   (debug-nan[lightning])
    debug_nan.integrations.hf.DebugNaNCallback         a transformers.TrainerCallback (debug-nan[hf])

Both run the CLI's own watch, replay, diagnosis, summary, JSON report and repro bundle (session.py is the shared
adapter: the Monitor split at the points a framework's hooks reach). Import the submodule you need: this package
imports neither framework.
"""
