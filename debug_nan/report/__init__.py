"""Report tier: the finding, the text log and the JSON report."""
