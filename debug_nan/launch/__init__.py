"""`debug-nan run -- COMMAND`: watch the user's own, unmodified training command (see job.py)."""
