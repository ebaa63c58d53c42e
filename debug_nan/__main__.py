"""`python -m debug_nan`: the signal handlers first, so that a SIGTERM while the cli (and then torch) imports
ends with exit 143 and the interrupted report, never a traceback from inside an import."""

import sys

from debug_nan.process import interrupts

interrupts.install()
try:
    with interrupts.deferred():
        from debug_nan.app import cli
except KeyboardInterrupt as exc:  # (raised once the import ended: cli is whole)
    from debug_nan.app import cli

    cli.interrupted_at_start(exc, sys.argv[1:])
cli.main()
