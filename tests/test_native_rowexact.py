"""The row-exact attention kernel (:mod:`specsample.kernels.cpu.rowexact`).

It agrees with PyTorch's attention to float32 rounding (grouped-query heads, head sizes
that are and are not multiples of 16, strided queries), gives padding queries zeros, and
gives each query row the same bits whatever else the call holds: the row alone, the row
among others, the cache wider or holed with masked slots, on one thread or two.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

pytest.importorskip("numba")

from specsample.adapter import exact
from specsample.kernels.cpu import rowexact

LOW = torch.finfo(torch.float32).min


def _case(dim: int, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Queries ``[3, 4, 5, dim]``, keys and values ``[3, 2, 30, dim]`` and a causal mask
    with random holes (the first sequence's third query sees nothing)."""
    generator = torch.Generator().manual_seed(seed)
    batch, heads, kv_heads, n, width = 3, 4, 2, 5, 30
    query = torch.randn(batch, heads, n, dim, generator=generator)
    keys = torch.randn(batch, kv_heads, width, dim, generator=generator)
    values = torch.randn(batch, kv_heads, width, dim, generator=generator)
    allowed = torch.rand(batch, 1, n, width, generator=generator) > 0.3
    allowed[..., -n:] &= torch.ones(n, n, dtype=torch.bool).tril()
    allowed[0, 0, 2] = False
    mask = torch.zeros(batch, 1, n, width).masked_fill(~allowed, LOW)
    return query, keys, values, mask


def _attend(*args: torch.Tensor, threads: int = 1) -> torch.Tensor:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        out = exact.attend(*args, 0.3)
    finally:
        torch.set_num_threads(before)
    assert out is not None
    return out


@pytest.mark.parametrize("dim", [8, 20, 64])
def test_it_agrees_with_pytorchs_attention(dim: int) -> None:
    query, keys, values, mask = _case(dim)
    want = F.scaled_dot_product_attention(
        query, keys, values, attn_mask=mask, scale=0.3, enable_gqa=True
    )
    got = _attend(query, keys, values, mask)
    sees = (mask > LOW).any(-1, keepdim=True).expand_as(want)
    torch.testing.assert_close(got[sees], want[sees], rtol=0, atol=2e-6)
    assert not got[0, :, 2].any()  # a query that sees nothing: zeros


def test_a_strided_query_gives_the_same_bits() -> None:
    query, keys, values, mask = _case(64)
    wide = torch.cat([query, query], dim=-1)[..., :64]
    assert torch.equal(_attend(wide, keys, values, mask), _attend(query, keys, values, mask))


def _holed(slots: torch.Tensor, hole: torch.Tensor, dim: int) -> torch.Tensor:
    """``slots`` with ``hole`` before them and in their middle, along ``dim``."""
    half = slots.shape[dim] // 2
    first, second = slots.split([half, slots.shape[dim] - half], dim=dim)
    return torch.cat([hole, first, hole, second], dim=dim)


@pytest.mark.parametrize("dim", [20, 64])
def test_each_row_gets_the_same_bits_whatever_else_the_call_holds(dim: int) -> None:
    query, keys, values, mask = _case(dim, seed=1)
    together = _attend(query, keys, values, mask)
    assert torch.equal(_attend(query, keys, values, mask, threads=2), together)
    hole = torch.randn(1, keys.shape[1], 7, dim)
    hidden = torch.full((1, 1, 1, 7), LOW)
    for b in range(query.shape[0]):
        for r in range(query.shape[2]):
            one = query[b : b + 1, :, r : r + 1]
            seen = mask[b : b + 1, :, r : r + 1]
            alone = _attend(one, keys[b : b + 1], values[b : b + 1], seen)
            assert torch.equal(alone[0, :, 0], together[b, :, r])
            holed = _attend(
                one,
                _holed(keys[b : b + 1], hole, 2),
                _holed(values[b : b + 1], hole, 2),
                _holed(seen, hidden, 3),
                threads=2,
            )
            assert torch.equal(holed[0, :, 0], together[b, :, r])


def test_the_kernel_declines_what_it_cannot_take() -> None:
    assert not exact.possible(torch.float64, torch.device("cpu"))
    assert rowexact.MASKED > LOW
