"""The built-in task: AAM-style microbiome transformers, a plug-in like any --task (it implements the Task seam
of debug_nan.drivers.task and imports no driver).

data/ (BIOM table + phylogenetic tree or synthetic data -> nucleotide tokens, token-limited samples, UniFrac
targets, collated batches, with validation that names the sample) ; model/ (the AAM model: ASV encoder,
attention with padding guards) ; task.py (the Task: its data, model, loss, recipe) ; sizes.py (its largest
activations: the memory check, the out-of-memory advice) ; settings.py (AAMSettings: its [data] and [model]).
"""
