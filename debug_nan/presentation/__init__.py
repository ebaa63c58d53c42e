"""Presentation: the engine's data (Finding, History, Outcome) as the user reads it. Runs no step, replays nothing.

log.py (the text log on stderr, every line within line_width.py's 100 columns; another rank's lines marked) ;
step_line.py (a step's lines, --quiet's one line) ; summary.py (the closing summary) ; report.py (the JSON report:
one layout and its schema_version for every entry point) ; history_rows.py / history_table.py (the log's history
table) / history_plot.py (--plot) / tensorboard.py (--tensorboard) ; pipeline.py (the one output pipeline, from a
run's result to the table, report, plot, TensorBoard and summary) ; bundle.py (the repro bundle file format) /
bundle_signature.py (its signature, checked before it is unpickled) / bundle_key.py (the key that signs it, the
trusted keys) ; outputs.py (atomic writes and output-path checks: a file is whole or absent).
"""
