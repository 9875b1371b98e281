"""The keyed Gumbel noise of ``method="gumbel"``: a pure function of the row key and the
token, bounded by ``GUMBEL_MAX``, standard Gumbel in its moments; the keys of a step."""

from __future__ import annotations

import math

import torch

from specsample.noise import GUMBEL_MAX, gumbel_noise, request_keys, row_keys
from specsample.params.seeding import Seeding
from specsample.random import Stream, hash_bits, stream_key

CPU = torch.device("cpu")


def test_the_noise_is_a_pure_function_of_key_and_token() -> None:
    keys = row_keys(torch.tensor([3, 3, 4]), torch.tensor([9, 9, 9]))
    noise = gumbel_noise(keys, 0, 1000)
    assert torch.equal(noise[0], noise[1]) and not torch.equal(noise[0], noise[2])
    assert torch.equal(gumbel_noise(keys, 400, 600), noise[:, 400:600])
    assert bool((noise < GUMBEL_MAX).all())


def test_the_noise_has_the_moments_of_a_standard_gumbel() -> None:
    noise = gumbel_noise(row_keys(torch.arange(64), torch.arange(64)), 0, 4096).view(-1)
    count = noise.numel()
    # mean: Euler's constant, variance pi^2 / 6; 6 standard errors (false failure < 1e-8)
    assert abs(float(noise.mean()) - 0.5772156649) < 6 * math.sqrt(math.pi**2 / 6 / count)
    assert abs(float(noise.var()) - math.pi**2 / 6) < 6 * math.sqrt(5.4 / count) * 2


def test_seeded_requests_are_keyed_by_seed_and_position() -> None:
    seeding = Seeding.build(3, CPU, seeds=[5, None, 5])
    keys, counters = request_keys(seeding, torch.tensor([10, 20, 30]), CPU)
    assert int(keys[0]) == int(keys[2]) == int(stream_key(torch.tensor([5]), Stream.GUMBEL)[0])
    assert counters.tolist() == [10, 0, 30]
    rows = row_keys(keys, counters)
    assert int(rows[0]) == int(hash_bits(keys[:1], torch.tensor([[10]]))[0, 0])


def test_unseeded_requests_draw_one_key_per_step() -> None:
    generator = torch.Generator().manual_seed(0)
    seeding = Seeding.build(2, CPU, generator=generator)
    first, _ = request_keys(seeding, None, CPU)
    second, _ = request_keys(seeding, None, CPU)
    assert not torch.equal(first, second)
    assert bool(((first >= 0) & (first < 1 << 32)).all())
