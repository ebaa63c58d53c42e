"""The engine: detect, replay, explain. No file I/O, no training loop, no printing; every entry point drives it.

Stages, each a sub-package importing only the ones before it (tests/unit/test_layers.py checks it):

    vocabulary.py, stats.py  the words every stage shares (CheckKind, Phase, Cause, dialects); tensor helpers
    (stats_record.py: TensorStats, plain numbers)
    watch/    on-device checks of each micro-batch (loss, gradients, parameters, optimizer state, buffers, module
              outputs), read in ONE host sync -> MicroResult; the per-step History
    trace/    the tracer: every op of a replayed micro-batch with its provenance -> a Trace of OpEvents
    explain/  a Trace and the Trip it answers -> Finding (the op, module, source line, cause and advice)
    replay/   the state copy (Snapshot), the StepDriver protocol (what a driver must offer to be replayed),
              Pinpointer: a Trip -> the replay under the tracer -> explain
    session/  StepSession: THE step protocol every entry point runs (begin_step, begin_micro, watch_loss,
              end_micro, decide, stepped, finish), built from SessionPolicies; the DDP agreement; the copies

Hand-offs are data: MicroResult (watch -> session), Trip (session -> replay), Trace (replay -> explain), Finding
(explain -> presentation), each a dataclass that serialises.
"""
