"""Report tier: the text log and its per-step lines, the summary and the JSON report, repro bundles (a file format)."""
