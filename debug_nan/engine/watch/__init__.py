"""The watch: what is checked in every micro-batch, on the device, and read back in one host sync.

watch.py (Watch: the loss, gradient norms, module outputs via module_hooks.py, parameters and optimizer state,
with norms.py's fused reductions) -> watch_result.py (MicroResult: what one sync read, and the first harm: a
Check of a CheckKind) ; buffer_watch.py (buffers that turn non-finite); phase_codes.py (a check kind -> the phase
it points at); history.py (a bounded per-step record: losses, norms, the largest activations); quiet.py
(warnings for finite runs that do not train); clipping.py (whether the run clips its gradients: the advice's
evidence); sampled.py (the dataset indices of the batches a DataLoader yielded: a data finding names its record).
"""
