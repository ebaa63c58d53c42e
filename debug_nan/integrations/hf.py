"""The public import path of debug-nan's Hugging Face Trainer callback (it lives in `debug_nan.drivers.hf`)."""

from debug_nan.drivers.hf import DebugNaNCallback

__all__ = ["DebugNaNCallback"]
