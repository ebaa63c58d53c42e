"""The tracer: every op of a replayed micro-batch, with where its inputs came from.

tracer.py (a TorchDispatchMode + autograd hooks over the replay: each op's output checked, the first non-finite
ones kept as OpEvents with their module, source line and input statistics) ; events.py (OpEvent, the traced op);
provenance.py (which earlier op wrote a storage: origins across in-place ops and views); module_context.py
(which module and which line of the user's code an op ran in).
"""
