"""engine/stats.py's walk over a batch (flat_tensors, map_tensors, move_to, capture_batch): every container
torch.utils._pytree knows and any other Mapping, each rebuilt as its own type, the user's batch never changed."""

import collections
import dataclasses
from collections import OrderedDict, UserDict
from types import MappingProxyType

import pytest
import torch
from torch.utils import _pytree as pytree

from debug_nan.engine.stats import capture_batch, flat_tensors, map_tensors, move_to

CPU = torch.device("cpu")
Pair = collections.namedtuple("Pair", "x y")


@dataclasses.dataclass
class Registered:
    inputs: torch.Tensor
    label: str


pytree.register_dataclass(Registered)


@dataclasses.dataclass
class Unregistered:
    inputs: torch.Tensor


class ReadOnly(collections.abc.Mapping):
    """A Mapping that is no dict, built from one."""

    def __init__(self, data):
        self._data = dict(data)

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self):
        return len(self._data)


def test_a_plain_dict_list_and_tuple_batch_walks_as_before():
    a, b, c = torch.zeros(2), torch.ones(3), torch.full((1,), 2.0)
    batch = {"tokens": a, "pair": [b, (c, "id")], "ids": ["s1", "s2"], 7: a}
    assert [(p, t) for p, t in flat_tensors(batch)] == [("tokens", a), ("pair[0]", b), ("pair[1][0]", c), ("7", a)]
    assert flat_tensors(a) == [("", a)] and flat_tensors("text") == [] and flat_tensors([]) == []
    kept = capture_batch(batch, CPU)
    assert type(kept) is dict and type(kept["pair"]) is list and type(kept["pair"][1]) is tuple
    assert kept["ids"] == ["s1", "s2"] and kept["pair"][1][1] == "id"  # non-tensor leaves pass through
    assert kept["tokens"] is not a and torch.equal(kept["tokens"], a)


def test_a_batch_encoding_is_copied_as_a_batch_encoding_and_checked_by_key():
    transformers = pytest.importorskip("transformers")
    ids = torch.tensor([[5, 1, 2]])
    embeds = torch.tensor([[[0.5, float("nan")]]])
    batch = transformers.BatchEncoding({"input_ids": ids, "inputs_embeds": embeds}, n_sequences=1)
    assert [p for p, _ in flat_tensors(batch)] == ["input_ids", "inputs_embeds"]
    kept = capture_batch(batch, CPU)
    assert type(kept) is transformers.BatchEncoding and kept.n_sequences == 1  # its own attributes kept
    assert kept["inputs_embeds"].data_ptr() != embeds.data_ptr()  # a copy: safe from the script's in-place changes
    embeds.zero_()
    assert torch.isnan(kept["inputs_embeds"]).any()
    assert batch["inputs_embeds"] is embeds and list(batch) == ["input_ids", "inputs_embeds"]  # the user's unchanged
    kept["input_ids"] = None
    assert batch["input_ids"] is ids  # two containers: replacing a key of the copy leaves the batch alone
    assert type(move_to(batch, CPU, copy=True)) is transformers.BatchEncoding


def test_a_mapping_that_is_not_a_dict_keeps_its_type_or_becomes_a_dict():
    t = torch.ones(2)
    for mapping in (UserDict({"x": t}), ReadOnly({"x": t}), OrderedDict(x=t)):
        kept = capture_batch(mapping, CPU)
        assert type(kept) is type(mapping) and kept["x"] is not t and torch.equal(kept["x"], t)
        assert flat_tensors(mapping) == [("x", t)]
    proxy = capture_batch(MappingProxyType({"x": t}), CPU)  # (its type cannot be built from a dict)
    assert type(proxy) is MappingProxyType and proxy["x"] is not t


def test_a_named_tuple_is_rebuilt_and_its_fields_named():
    x, y = torch.zeros(1), torch.ones(1)
    assert flat_tensors({"batch": Pair(x, y)}) == [("batch.x", x), ("batch.y", y)]
    kept = capture_batch(Pair(x, "label"), CPU)
    assert type(kept) is Pair and kept.y == "label" and kept.x is not x


def test_a_dataclass_is_walked_where_it_is_registered_with_pytree():
    t = torch.zeros(3)
    kept = capture_batch([Registered(t, "a")], CPU)
    assert type(kept[0]) is Registered and kept[0].label == "a" and kept[0].inputs is not t
    assert flat_tensors([Registered(t, "a")]) == [("[0].inputs", t)]
    unregistered = Unregistered(t)
    assert flat_tensors(unregistered) == [] and capture_batch(unregistered, CPU) is unregistered  # a leaf


def test_nested_foreign_containers_inside_pytree_ones():
    transformers = pytest.importorskip("transformers")
    t = torch.zeros(2)
    batch = {"text": transformers.BatchEncoding({"ids": t}), "views": (UserDict({"a": [t]}), Pair(t, t))}
    assert [p for p, _ in flat_tensors(batch)] == ["text.ids", "views[0].a[0]", "views[1].x", "views[1].y"]
    moved = map_tensors(lambda x: x + 1, batch)
    assert type(moved["text"]) is transformers.BatchEncoding and type(moved["views"][0]) is UserDict
    assert torch.equal(moved["views"][0]["a"][0], torch.ones(2)) and torch.equal(t, torch.zeros(2))


def test_subclasses_of_list_and_tuple_keep_their_type():
    class Batch(list):
        pass

    t = torch.zeros(1)
    kept = capture_batch(Batch([t, 1]), CPU)
    assert type(kept) is Batch and kept[1] == 1 and kept[0] is not t
    assert flat_tensors(Batch([t])) == [("[0]", t)]
