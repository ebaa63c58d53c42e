"""debug-nan inside the training loops people already have: the public import paths of the framework callbacks.

    debug_nan.integrations.lightning.DebugNaNCallback  a lightning.pytorch.Callback   (debug-nan[lightning])
    debug_nan.integrations.hf.DebugNaNCallback         a transformers.TrainerCallback (debug-nan[hf])

They live in `debug_nan.drivers` (drivers of the one step session, like the CLI's Trainer, the Monitor and `run`);
these modules keep the paths users import stable. Import the submodule you need: this package imports neither
framework.
"""
