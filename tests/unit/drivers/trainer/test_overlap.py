"""drivers/trainer/overlap.py: the gradient buckets follow the parameters' order, split by dtype and cap. (On two
gloo ranks: tests/e2e/ddp/test_overlap.py.)"""


import torch

from debug_nan.drivers.trainer.overlap import plan_buckets


def test_buckets_follow_the_order_split_by_dtype_and_cap():
    params = [torch.zeros(10), torch.zeros(10), torch.zeros(10, dtype=torch.float64), torch.zeros(100),
              torch.zeros(5)]
    # 40-byte float32 tensors; cap 100 bytes: two fit, a float64 starts a bucket, 400 bytes stand alone
    assert plan_buckets(params, [0, 1, 2, 3, 4], 100) == [[0, 1], [2], [3], [4]]
    assert plan_buckets(params, [4, 1, 0, 3, 2], 100) == [[4, 1, 0], [3], [2]]  # 20 + 40 + 40 bytes
