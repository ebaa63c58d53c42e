"""Process concerns every layer may need: signals (interrupts.py: SIGINT / SIGTERM -> exit 130 with the log
kept), standard streams (streams.py: SIGHUP, broken, full or closed stdout/stderr), the machine's memory
(memory.py: what can still be given, for the checks that refuse first), the start-up hook of `debug-nan run --
PROGRAM` (startup_hook.py: copied as sitecustomize.py; standard library only, inert until the process trains)."""
