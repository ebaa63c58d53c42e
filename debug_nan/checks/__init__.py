"""Checks tier: watch (always on, on-device flags), pinpoint (op-level replay), diagnose (named causes)."""
