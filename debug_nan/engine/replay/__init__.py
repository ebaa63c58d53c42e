"""Replay: the failing micro-batch (or update) run again from the copy of its step's start, under the tracer.

snapshot.py (Snapshot: parameters, buffers, training flags, optimizer, scaler, scheduler, RNG) ; driver.py (the
StepDriver protocol: everything a replay reads from whoever runs the steps; StepInputs: the step's micro-batches,
RNG states and tapes) ; pinpoint.py (Pinpointer: Trip -> replay -> explain) ; catch_up.py (re-run the steps since
an older copy, checked exactly against the watch) ; buffer_writers.py (the op that wrote a non-finite buffer) ;
start_state.py (state the run did not write: the harm was there at the step's start) ; live.py (a micro-batch
traced as it ran, `run --trace-at`: explained instead of a replay) ; fell_short.py (a replay that could not run,
or stayed finite: replayed once more, transient or not).
"""
