"""The compiled CPU loop of the counter-based hash (:mod:`specsample.kernels.cpu.hashing`).

Once the kernels are compiled, the ``specsample::hash_uniform`` operator's CPU kernel runs the
loop instead of the integer tensor chain: it must give the chain's numbers bit for bit
(integer arithmetic, so equality, not closeness), for every stream, seeds across the whole
int64 range, counters past ``2**32`` (both halves of a counter are hashed), int32 inputs and
non-contiguous counters. Skipped without numba.
"""

from __future__ import annotations

import pytest
import torch

from specsample.kernels.cpu import compiler
from specsample.random import Stream, counter_uniform, hash_chain, stream_key

pytestmark = pytest.mark.skipif(not compiler.available(), reason="the compiled loop needs numba")


@pytest.fixture(autouse=True, scope="module")
def _compiled() -> None:
    compiler.warm_up()
    assert compiler.ready()


def test_the_loop_gives_the_chains_numbers_bit_for_bit() -> None:
    gen = torch.Generator().manual_seed(0)
    seeds = torch.randint(-(2**63), 2**63 - 1, (64,), generator=gen)
    seeds[:4] = torch.tensor([0, -1, 2**63 - 1, -(2**63)])
    counters = torch.randint(0, 2**62, (64, 9), generator=gen)
    counters[:, :3] = torch.tensor([0, 2**32 - 1, 2**32])
    for stream in Stream:
        key = stream_key(seeds, stream)
        expected = hash_chain(key, counters)
        assert torch.equal(counter_uniform(seeds, counters, stream), expected)
        assert torch.equal(counter_uniform(seeds, counters, stream, key=key), expected)
        every_other = counters[:, ::2]
        assert not every_other.is_contiguous()
        assert torch.equal(
            counter_uniform(seeds, every_other, stream),
            hash_chain(key, every_other.contiguous()),
        )


def test_int32_inputs_and_broadcast_counters() -> None:
    seeds = torch.tensor([5, 6, 7], dtype=torch.int32)
    counters = torch.arange(4, dtype=torch.int32).expand(3, 4)
    key = stream_key(seeds, Stream.FINAL)
    got = counter_uniform(seeds, counters, Stream.FINAL)
    assert got.dtype == torch.float64 and got.shape == (3, 4)
    assert torch.equal(got, hash_chain(key, counters.to(torch.int64).contiguous()))
    assert bool(((got >= 0) & (got < 1)).all())
