"""The KV cache the loop owns (:mod:`specsample.adapter.cache`) and its ``transformers``
boundary (:mod:`specsample.adapter.model_cache`).

Also covers the 4-D attention masks of a forward over the cache
(:mod:`specsample.adapter.masks`).

Every operation (add slots and write them, mark the tail, drop the tail, select rows, join
another cache, compact) is checked against a plain recomputation: per row, the list of its
slots (key, value, mask bit, position) kept by hand, whose valid slots must be, in order,
the valid slots of the cache. Through a model, each forward writes only its new slots into
a buffer with room to spare, and the logits equal those of a forward without a cache.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from specsample.adapter import KVCache

HEADS, DIM, LAYERS = 2, 3, 2

Slot = tuple[list[torch.Tensor], list[torch.Tensor], int, int]
"""Per layer keys ``[heads, dim]``, per layer values, mask bit and position of one slot."""


class Plain:
    """The reference: each row a list of its slots, in order."""

    def __init__(self, batch: int) -> None:
        self.rows: list[list[Slot]] = [[] for _ in range(batch)]

    def add(self, keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, positions: Any):
        for row, slots in enumerate(self.rows):
            for j in range(keys.shape[3]):
                slots.append(
                    (
                        [keys[layer, row, :, j] for layer in range(LAYERS)],
                        [values[layer, row, :, j] for layer in range(LAYERS)],
                        int(valid[row, j]),
                        int(positions[row, j]),
                    )
                )

    def set_tail(self, valid: torch.Tensor) -> None:
        n = valid.shape[1]
        for row, slots in enumerate(self.rows):
            for j in range(n):
                keys, values, _, position = slots[len(slots) - n + j]
                slots[len(slots) - n + j] = (keys, values, int(valid[row, j]), position)

    def valid(self, row: int) -> list[Slot]:
        return [slot for slot in self.rows[row] if slot[2]]


def _step(cache: KVCache, plain: Plain, n: int, generator: torch.Generator) -> None:
    """Add ``n`` random slots to every row of both, some of them masked."""
    batch = cache.batch
    keys = torch.randn(LAYERS, batch, HEADS, n, DIM, generator=generator, dtype=torch.float64)
    values = torch.randn(LAYERS, batch, HEADS, n, DIM, generator=generator, dtype=torch.float64)
    valid = (torch.rand(batch, n, generator=generator) < 0.7).to(torch.int64)
    positions = torch.randint(0, 1000, (batch, n), generator=generator)
    cache.add_slots(n, valid, positions)
    for layer in range(LAYERS):
        got_keys, got_values = cache.update(layer, keys[layer], values[layer])
        assert got_keys.shape == (batch, HEADS, cache.width, DIM)
        assert torch.equal(got_values[:, :, -n:], values[layer])
    plain.add(keys, values, valid, positions)


def _assert_same(cache: KVCache, plain: Plain) -> None:
    """The cache is rectangular and holds, row by row, the plain rows' valid slots in order."""
    assert cache.batch == len(plain.rows)
    assert cache.mask.shape == cache.positions.shape == (cache.batch, cache.width)
    for layer in range(LAYERS):
        assert cache.length(layer) == cache.width
    for row in range(cache.batch):
        kept = cache.mask[row].bool()
        want = plain.valid(row)
        assert int(kept.sum()) == len(want)
        assert cache.positions[row, kept].tolist() == [slot[3] for slot in want]
        for layer in range(LAYERS):
            keys, values = cache.layer(layer)
            for got, part in ((keys, 0), (values, 1)):
                expected = [slot[part][layer] for slot in want]
                got_rows = got[row][:, kept]
                if expected:
                    assert torch.equal(got_rows, torch.stack(expected, dim=1))
                else:
                    assert got_rows.shape[1] == 0


def test_add_slots_and_set_the_tail_as_plain_lists_do() -> None:
    generator = torch.Generator().manual_seed(0)
    cache, plain = KVCache(3), Plain(3)
    for n in (5, 1, 4, 40, 2):
        _step(cache, plain, n, generator)
        _assert_same(cache, plain)
    tail = torch.tensor([[1, 0], [0, 0], [1, 1]])
    cache.set_tail_valid(tail)
    plain.set_tail(tail)
    _assert_same(cache, plain)


def test_drop_tail_writes_over_the_dropped_slots_in_place() -> None:
    generator = torch.Generator().manual_seed(1)
    cache, plain = KVCache(2), Plain(2)
    _step(cache, plain, 6, generator)
    buffer = cache.layer(0)[0].untyped_storage().data_ptr()
    cache.drop_tail(2)
    for slots in plain.rows:
        del slots[-2:]
    _assert_same(cache, plain)
    assert cache.width == 4 and cache.mask.shape == (2, 4)
    _step(cache, plain, 3, generator)
    _assert_same(cache, plain)
    assert cache.layer(0)[0].untyped_storage().data_ptr() == buffer
    cache.drop_tail(0)
    assert cache.width == 7


def test_select_keeps_rows_in_the_order_asked() -> None:
    generator = torch.Generator().manual_seed(2)
    cache, plain = KVCache(4), Plain(4)
    _step(cache, plain, 5, generator)
    order = [3, 0, 2]
    cache.select(torch.tensor(order))
    plain.rows = [plain.rows[i] for i in order]
    _assert_same(cache, plain)
    _step(cache, plain, 70, generator)
    _assert_same(cache, plain)


@pytest.mark.parametrize(("mine", "theirs"), [(5, 2), (2, 5), (0, 3), (3, 0), (4, 4)])
def test_join_appends_rows_left_padded_with_masked_slots(mine: int, theirs: int) -> None:
    generator = torch.Generator().manual_seed(3)
    cache, plain = KVCache(2), Plain(2)
    other, other_plain = KVCache(3), Plain(3)
    if mine:
        _step(cache, plain, mine, generator)
    if theirs:
        _step(other, other_plain, theirs, generator)
    if not mine and not theirs:
        return
    cache.join(other)
    plain.rows += other_plain.rows
    assert cache.width == max(mine, theirs)
    _assert_same(cache, plain)
    width = cache.width
    assert not cache.mask[:2, : width - mine].any() and not cache.mask[2:, : width - theirs].any()
    _step(cache, plain, 2, generator)
    _assert_same(cache, plain)


def test_compact_drops_every_masked_slot_and_keeps_the_order() -> None:
    generator = torch.Generator().manual_seed(4)
    cache, plain = KVCache(3), Plain(3)
    assert not cache.compact()
    for n in (7, 3, 5):
        _step(cache, plain, n, generator)
    longest = max(len(plain.valid(row)) for row in range(3))
    assert cache.compact()
    assert cache.width == longest
    for row in range(3):
        count = len(plain.valid(row))
        assert cache.mask[row].tolist() == [0] * (longest - count) + [1] * count
    _assert_same(cache, plain)
    _step(cache, plain, 2, generator)
    _assert_same(cache, plain)


def test_update_refuses_tensors_that_are_not_four_dimensional() -> None:
    cache = KVCache(1)
    cache.add_slots(2)
    with pytest.raises(ValueError, match=r"key and value must be \[batch, heads, slots, dim\]"):
        cache.update(0, torch.zeros(1, 2, 4), torch.zeros(1, 2, 4))


def test_the_boundary_is_a_transformers_cache_over_our_tensors() -> None:
    transformers = pytest.importorskip("transformers")
    from specsample.adapter.model_cache import model_cache

    cache = KVCache(1)
    boundary = model_cache(cache)
    assert isinstance(boundary, transformers.Cache)
    cache.add_slots(3)
    key, value = torch.randn(1, HEADS, 3, DIM), torch.randn(1, HEADS, 3, DIM)
    assert boundary.get_seq_length() == 0 and boundary.get_mask_sizes(3, 0) == (3, 0)
    keys, values = boundary.update(key, value, 0)
    assert torch.equal(keys, key) and torch.equal(values, value)
    assert torch.equal(cache.layer(0)[0], key)
    assert boundary.get_seq_length(0) == 3 and boundary.get_mask_sizes(2, 0) == (5, 0)
    assert boundary.get_mask_sizes(torch.arange(3, 5), 0) == (5, 0)


@pytest.mark.parametrize("fused", [True, False])
def test_the_cache_appends_in_place_and_computes_what_a_concatenating_cache_does(
    fused: bool,
) -> None:
    """Each forward writes only its new slots into a buffer with room to spare (no copy of
    the cache); the logits equal those of a forward without a cache."""
    transformers = pytest.importorskip("transformers")
    from specsample.adapter import CachedLM
    from tests.tiny_llama import llama_config

    config = llama_config(
        2, vocab_size=32, hidden_size=16, intermediate_size=32, max_position_embeddings=64
    )
    torch.manual_seed(0)
    target = transformers.LlamaForCausalLM(config).double().eval()
    lm = CachedLM(target, fused=fused)
    assert (lm.fused is not None) == fused
    lm.reset(1)
    assert lm.cache is not None
    ids = torch.tensor([[1, 2, 3, 4, 5, 6]])
    first = lm.forward(ids[:, :4], torch.arange(4).unsqueeze(0), keep=0)
    buffer = lm.cache.layer(0)[0].untyped_storage().data_ptr()
    second = lm.forward(ids[:, 4:], torch.arange(4, 6).unsqueeze(0), keep=0)
    keys = lm.cache.layer(0)[0]
    assert keys.shape[2] == 6 and keys.untyped_storage().data_ptr() == buffer
    lm.drop_tail(1)
    lm.forward(ids[:, 5:], torch.tensor([[5]]))
    assert lm.cache.layer(0)[0].untyped_storage().data_ptr() == buffer
    with torch.no_grad():
        expected = target(ids, use_cache=False).logits
    torch.testing.assert_close(torch.cat([first, second], dim=1), expected)
