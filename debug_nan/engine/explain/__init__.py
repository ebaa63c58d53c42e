"""Explain: a traced origin -> a Finding (what, where, why, what to try). Pure: no driver, no replay.

explain.py (explain(Trace) -> Finding: the one function every entry point's trip ends in; Trace is the
replay's hand-off) ; diagnose.py (the
cause rules in causes/, each a function (OpEvent, batch) -> (Cause, evidence)) ; finding.py (Finding, the
hand-off to presentation: to_dict() is the JSON report's `findings` entry; plain values, no torch) ; evidence.py
(what findings are built from, and the findings that need no replay: a non-finite batch, a watch-only trip, an
explosion) ; optimizer_evidence.py (the step's
param groups as evidence for an optimizer-phase origin) ; fallback.py (a replay that fell short: it says so, and
`--trace-at` with the user's command comes first).
"""
