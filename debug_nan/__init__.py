"""debug-nan: find where the first NaN/Inf of a training run was born, and why."""

__version__ = "0.1.0"
