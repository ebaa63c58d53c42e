"""The public import path of debug-nan's PyTorch Lightning callback (it lives in `debug_nan.drivers.lightning`)."""

from debug_nan.drivers.lightning import DebugNaNCallback

__all__ = ["DebugNaNCallback"]
