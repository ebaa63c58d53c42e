"""The built-in AAM model: aam.py (nucleotide embedding -> ASV encoder -> sample encoder -> UniFrac and nucleotide
heads) ; attention.py (self-attention whose padding masks cannot make a NaN row)."""
