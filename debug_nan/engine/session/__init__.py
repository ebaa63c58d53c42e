"""The step session: THE protocol every entry point runs, written once.

session.py (StepSession: begin_step, begin_micro, watch_loss/watch_grads, end_micro, decide, stepped, finish;
SessionPolicies: what differs between entry points, built in one place from the settings) ; agreement.py (the
ranks' agreement under DDP) ; distributed.py (process-group facts and collectives) ; copies.py (when the state is
copied) ; output_schedule.py (when module outputs are measured) ; outcome.py (a decision: clean, trip, skipped
step) ; result.py (RunResult: what the outputs are made from, plain values) ; unreplayed.py (trips the replay
cannot name) ; repro.py (what a repro bundle holds) ; precision.py (the CLI's --precision, the autocast state a
recorded call ran under and its exact re-entry, the loss scale's overflow rule, the run of steps a GradScaler
skipped).
"""
