"""Nucleotide tokens, AAM conventions: pad 0, A 1, C 2, G 3, T 4, START 5; START + 150 bases = 151 positions.

Tokenising is vectorised over the whole ASV set at once: sequences become a fixed-width byte matrix and one
lookup table maps bytes to tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

PAD, A, C, G, T, START = 0, 1, 2, 3, 4, 5
VOCAB_SIZE = 6
MAX_BASES = 150
ASV_LEN = MAX_BASES + 1

# IUPAC ambiguity codes are DNA but carry no single base: they become PAD (masked) and are counted.
AMBIGUOUS = "NRYSWKMBDHVnryswkmbdhv-."
_INVALID = 255
_LOOKUP = np.full(256, _INVALID, dtype=np.uint8)
for _chars, _tok in (("Aa", A), ("Cc", C), ("Gg", G), ("TtUu", T)):
    for _ch in _chars:
        _LOOKUP[ord(_ch)] = _tok
for _ch in AMBIGUOUS:
    _LOOKUP[ord(_ch)] = PAD
_LOOKUP[0] = PAD  # the zero padding of the fixed-width byte matrix

HEX = set("0123456789abcdefABCDEF")


@dataclass
class TokenReport:
    """What tokenising found: counts that the log states together with the policy."""

    n_sequences: int
    n_truncated: int = 0
    max_length: int = 0
    n_ambiguous_bases: int = 0
    n_with_ambiguous: int = 0
    invalid_examples: list[tuple[str, str]] = field(default_factory=list)  # (id, offending characters)
    n_invalid: int = 0

    def policy_lines(self) -> list[str]:
        lines = [f"{self.n_sequences} ASV sequences tokenised (START + up to {MAX_BASES} bases)."]
        if self.n_truncated:
            lines.append(f"{self.n_truncated} reads longer than {MAX_BASES} bases (longest {self.max_length}) "
                         f"were cut to their first {MAX_BASES} bases.")
        if self.n_ambiguous_bases:
            lines.append(f"{self.n_ambiguous_bases} ambiguous bases (IUPAC N, R, Y, ...) in {self.n_with_ambiguous} "
                         f"sequences became padding (masked) positions.")
        return lines


def looks_like_hash(seq_id: str) -> bool:
    """QIIME 2 feature IDs are MD5/SHA hex digests (32, 40 or 64 hex characters), not DNA."""
    return len(seq_id) in (32, 40, 64) and set(seq_id) <= HEX and not set(seq_id) <= set("ACGTacgt")


def tokenize(sequences: list[str], ids: list[str] | None = None) -> tuple[np.ndarray, TokenReport]:
    """Tokenise N sequences at once -> uint8 [N, 151] (START at position 0, bases after, PAD to the end)."""
    n = len(sequences)
    report = TokenReport(n_sequences=n)
    tokens = np.zeros((n, ASV_LEN), dtype=np.uint8)
    if n == 0:
        return tokens, report
    encoded = [s.encode("ascii", "replace") for s in sequences]
    lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=n)
    width = max(int(lengths.max()), 1)
    raw = np.array(encoded, dtype=f"S{width}").view(np.uint8).reshape(n, width)
    mapped = _LOOKUP[raw]
    bad = mapped == _INVALID
    if bad.any():
        rows = np.flatnonzero(bad.any(axis=1))
        report.n_invalid = int(rows.size)
        for r in rows[:5]:
            chars = sorted(set(raw[r][bad[r]].tobytes().decode("ascii", "replace")))
            report.invalid_examples.append(((ids[r] if ids else str(r)), "".join(chars)))
        mapped = np.where(bad, PAD, mapped)
    ambiguous = (raw != 0) & (mapped == PAD)
    ambiguous &= ~bad
    report.n_ambiguous_bases = int(ambiguous.sum())
    report.n_with_ambiguous = int(ambiguous.any(axis=1).sum())
    report.n_truncated = int((lengths > MAX_BASES).sum())
    report.max_length = int(lengths.max())
    keep = min(width, MAX_BASES)
    tokens[:, 0] = START
    tokens[:, 1:1 + keep] = mapped[:, :keep]
    return tokens, report
