"""debug-nan: find where the first NaN/Inf of a training run was born, and why."""

__version__ = "0.1.0"


def __getattr__(name):  # lazy: `import debug_nan` stays light for the CLI's --help
    if name in ("Monitor", "NonFiniteError"):
        from debug_nan.drivers import monitor as api

        return getattr(api, name)
    raise AttributeError(name)
