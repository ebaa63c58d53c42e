"""Model tier: the AAM-style reference model (the built-in task's model)."""
