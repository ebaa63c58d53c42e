"""The built-in task's data: readers.py (BIOM, Newick, FASTA) -> validation.py -> loading.py (a Dataset) ->
tokens.py / batches.py (token-limited truncating batches [B, A, L]); unifrac*.py (UniFrac targets [B, B]:
sparse, striped, cached); synthetic.py (a coherent table and tree when none is given); writing.py (the demo
files)."""
