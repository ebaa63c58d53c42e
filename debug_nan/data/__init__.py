"""Data tier: BIOM table + tree (or synthetic data) -> tokens, UniFrac targets, token-limited batches."""
