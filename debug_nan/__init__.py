"""debug-nan: find where the first NaN/Inf of a training run was born, and why."""

__version__ = "0.1.0"

from debug_nan.torch_support import python_problem as _python_problem  # (no torch: stays light)

if _python_problem() is not None:  # older than 3.10: one line, not a SyntaxError or an AttributeError later
    import os as _os
    import sys as _sys

    if _os.path.basename(_sys.argv[0]) == "debug-nan" or _sys.argv[0] == "-m":  # the CLI: the line and exit 2
        print("debug-nan: error: " + _python_problem(), file=_sys.stderr)
        raise SystemExit(2)
    raise ImportError(_python_problem())


def __getattr__(name):  # lazy: `import debug_nan` stays light for the CLI's --help
    if name in ("Monitor", "NonFiniteError"):
        from debug_nan.drivers import monitor as api

        return getattr(api, name)
    raise AttributeError(name)
