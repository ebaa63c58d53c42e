import numpy as np

from debug_nan.aam.data.tokens import ASV_LEN, START, looks_like_hash, tokenize


def test_tokens_map_bases_and_start():
    tokens, report = tokenize(["ACGT", "acgu"])
    assert tokens.shape == (2, ASV_LEN)
    assert tokens[0, :6].tolist() == [START, 1, 2, 3, 4, 0]
    assert tokens[1, :5].tolist() == [START, 1, 2, 3, 4]  # lower case and U read as T
    assert report.n_truncated == 0 and report.n_invalid == 0


def test_long_reads_are_cut_and_counted():
    tokens, report = tokenize(["A" * 200, "C" * 150, "G" * 10])
    assert report.n_truncated == 1 and report.max_length == 200
    assert (tokens[0, 1:] == 1).all() and (tokens[1, 1:] == 2).all()
    assert (tokens[2, 11:] == 0).all()


def test_ambiguous_bases_become_padding_and_invalid_characters_are_reported():
    tokens, report = tokenize(["ACNNT", "AXZ1"], ["a", "b"])
    assert tokens[0, :6].tolist() == [START, 1, 2, 0, 0, 4]
    assert report.n_ambiguous_bases == 2 and report.n_with_ambiguous == 1
    assert report.n_invalid == 1 and report.invalid_examples == [("b", "1XZ")]


def test_hash_detection():
    assert looks_like_hash("4b5eeb300368260019c1fbc7a3c718fc")
    assert not looks_like_hash("ACGT" * 8)
    assert not looks_like_hash("S1")


def test_vectorised_tokens_match_a_per_base_reference():
    rng = np.random.default_rng(0)
    seqs = ["".join(rng.choice(list("ACGT"), size=rng.integers(1, 160))) for _ in range(50)]
    tokens, _ = tokenize(seqs)
    lookup = {"A": 1, "C": 2, "G": 3, "T": 4}
    for row, seq in zip(tokens, seqs):
        expected = [START] + [lookup[c] for c in seq[:150]]
        assert row[:len(expected)].tolist() == expected
        assert (row[len(expected):] == 0).all()
