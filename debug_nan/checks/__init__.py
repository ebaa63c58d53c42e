"""Checks tier: watch (always on), snapshot, pinpoint (op-level replay through the StepDriver seam), diagnose (named
causes), the Finding. No file I/O, no Trainer."""
