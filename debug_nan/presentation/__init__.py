"""Presentation: the engine's data (Finding, History, Outcome) as the user reads it. Runs no step, replays nothing.

log.py (the text log on stderr, every line within line_width.py's 100 columns) ; step_line.py (a step's lines,
--quiet's one line) ; summary.py (the closing summary and the JSON report) ; history_rows.py / history_table.py
(the log's history table) / history_plot.py (--plot) / tensorboard.py (--tensorboard) ; bundle.py (the repro
bundle file format) / bundle_signature.py (its signature, checked before it is unpickled) / bundle_key.py
(the key that signs it, the trusted keys) ; outputs.py (atomic writes and output-path checks: a file is whole or
absent).
"""
