"""The dataset indices of the batches a DataLoader yields (engine/watch/sampled.py), found again by value."""

import torch
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.dataloader import _BaseDataLoaderIter

from debug_nan.engine.watch.sampled import PRINT, _head, dataset_indices, forget_batches, sampling


def test_a_shuffled_batch_is_named_by_its_samplers_indices_and_a_changed_one_by_none():
    torch.manual_seed(0)
    data = torch.arange(40, dtype=torch.float32).reshape(20, 2)  # record i holds 2i, 2i+1
    originals = {name: getattr(_BaseDataLoaderIter, name) for name in ("_next_index", "__next__", "_reset")}
    forget_batches()
    try:
        for name, wrapper in sampling(_BaseDataLoaderIter).items():
            setattr(_BaseDataLoaderIter, name, wrapper)
        batches = list(DataLoader(TensorDataset(data), batch_size=4, shuffle=True))
    finally:
        for name, original in originals.items():
            setattr(_BaseDataLoaderIter, name, original)
    (x,) = batches[-1]
    assert dataset_indices({"x": x.clone()}) == [int(v) // 2 for v in x[:, 0]]
    assert dataset_indices(x + 1) is None  # (changed values: no index claimed)
    forget_batches()
    assert dataset_indices(x) is None


def test_a_non_contiguous_batch_keeps_the_same_first_values_copied_from_its_leading_rows_only():
    images = torch.arange(64 * 3 * 8 * 8, dtype=torch.float32).reshape(64, 8, 8, 3).permute(0, 3, 1, 2)
    head = _head(images)  # (an NHWC batch seen as NCHW: 12288 values, PRINT of them kept)
    assert not images.is_contiguous() and head.shape == (PRINT,)
    assert torch.equal(head, images.reshape(-1)[:PRINT]) and head.untyped_storage().nbytes() == PRINT * 4
