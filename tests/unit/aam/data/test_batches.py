import numpy as np
import torch

from debug_nan.aam.data.batches import Collator, check_batch, select_asvs
from debug_nan.aam.data.tokens import START


def test_truncation_orders():
    idx = np.array([10, 11, 12, 13, 14])
    counts = np.array([1.0, 50.0, 3.0, 50.0, 7.0])
    rng = np.random.default_rng(0)
    assert select_asvs(idx, counts, 3, "first", rng)[0].tolist() == [10, 11, 12]
    assert select_asvs(idx, counts, 3, "abundance", rng)[0].tolist() == [11, 13, 14]
    rand, rand_counts = select_asvs(idx, counts, 3, "random", rng)
    assert len(set(rand.tolist())) == 3 and set(rand.tolist()) <= set(idx.tolist())
    np.testing.assert_array_equal(rand_counts, counts[rand - 10])
    assert select_asvs(idx, counts, 10, "first", rng)[0].tolist() == idx.tolist()


def test_collate_shapes_padding_and_truncation(tiny_data):
    dist = np.zeros((tiny_data.n_samples,) * 2)
    richness = tiny_data.richness()
    small, large = int(np.argmin(richness)), int(np.argmax(richness))
    batch = Collator(tiny_data, dist, token_limit=24, order="abundance")([small, large])
    tokens, counts = batch["tokens"], batch["counts"]
    assert tokens.shape == (2, 24, 151) and tokens.dtype == torch.int64
    assert counts.shape == (2, 24) and batch["unifrac"].shape == (2, 2)
    used = tokens.ne(0).any(-1)
    assert used[0].sum() == richness[small] and used[1].sum() == 24  # truncated to the token limit
    assert (tokens[0, richness[small]:] == 0).all()  # padding rows are all zero
    assert (counts[0, richness[small]:] == 0).all()
    lo, hi = tiny_data.counts.indptr[large], tiny_data.counts.indptr[large + 1]
    top = np.sort(tiny_data.counts.data[lo:hi])[::-1][:24]
    np.testing.assert_allclose(np.sort(counts[1].numpy())[::-1], top)
    check = check_batch(batch)
    assert check.start_preserved and check.problems == []
    assert check.padding_slots == [24 - int(richness[small]), 0]
    assert (tokens[used][:, 0] == START).all()


def test_batch_checks_flag_problems(tiny_data):
    batch = Collator(tiny_data, np.zeros((24, 24)), token_limit=24)([0, 1])
    batch["tokens"][0] = 0  # an empty sample
    batch["tokens"][1, 0, 0] = 1  # START lost
    batch["tokens"][1, 1, 5] = 9  # out of vocabulary
    batch["unifrac"][0, 1] = float("nan")
    check = check_batch(batch)
    assert not check.start_preserved and not check.target_finite
    assert check.empty_samples == [batch["sample_ids"][0]] and check.token_max == 9
    assert len(check.problems) == 4
