"""Counter-based random numbers and per-row seeding.

Statistical tests run at level ``ALPHA = 1e-6`` each (the chance an ideal generator fails
one): the uniformity test (2**20 draws, 256 bins) detects a TV >= 0.007 from uniform, the
pair test (2**18 pairs, 16 x 16 cells) a joint TV >= 0.014, both with probability >= 99%;
the correlation test allows 5 standard errors (false failure < 1e-6).
"""

from __future__ import annotations

import pytest
import torch

from specsample import verify
from specsample.params.seeding import Seeding
from specsample.random import Stream, counter_uniform
from specsample.sampler import RejectionSampler
from specsample.testing import chi2_sf, draw_inputs, make_family

CPU = torch.device("cpu")
ALPHA = 1e-6
"""Level of the uniformity tests: the chance that an ideal generator fails one of them."""


def _grid(seeds: torch.Tensor, n: int) -> torch.Tensor:
    return torch.arange(n).expand(seeds.shape[0], n)


def test_counter_uniform_is_deterministic_and_in_range() -> None:
    seeds = torch.tensor([0, 1, -1, 2**62, -(2**63), 2**63 - 1, 123456789])
    counters = torch.tensor([0, 1, 2, 2**32, 2**40 + 5, 2**62]).expand(seeds.shape[0], 6)
    first = counter_uniform(seeds, counters)
    again = counter_uniform(seeds.clone(), counters.clone())
    assert first.dtype == torch.float64 and first.shape == (7, 6)
    assert torch.equal(first, again)
    assert bool(((first >= 0) & (first < 1)).all())
    scaled = first * 2.0**32
    assert torch.equal(scaled, scaled.floor())


def test_counter_uniform_accepts_int32_inputs() -> None:
    seeds = torch.tensor([3, 4], dtype=torch.int32)
    counters = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    expected = counter_uniform(seeds.long(), counters.long())
    assert torch.equal(counter_uniform(seeds, counters), expected)


def test_counter_uniform_is_uniform() -> None:
    """Chi-square test of 2**20 draws on 256 equal bins.

    False-failure rate 1e-6 for an ideal generator; with df = 255 this detects a deviation
    of TV >= 0.007 from uniform with probability >= 99% (non-central chi-square, D >= 4 TV^2).
    """
    seeds = torch.arange(1024)
    values = counter_uniform(seeds, _grid(seeds, 1024)).view(-1)
    counts = torch.bincount((values * 256).long(), minlength=256).to(torch.float64)
    expected = values.numel() / 256
    statistic = float(((counts - expected) ** 2 / expected).sum())
    assert chi2_sf(statistic, 255) >= ALPHA
    assert abs(float(values.mean()) - 0.5) < 5 * (1 / 12 / values.numel()) ** 0.5


def test_consecutive_counters_are_independent() -> None:
    """Pairs ``(u_c, u_{c+1})`` fill a 16 x 16 grid uniformly.

    False-failure rate 1e-6; 2**18 pairs at df = 255 detect a joint TV >= 0.014 with
    probability >= 99%.
    """
    seeds = torch.arange(512) * 7 + 3
    values = counter_uniform(seeds, _grid(seeds, 1024))
    pairs = (values[:, 0::2] * 16).long() * 16 + (values[:, 1::2] * 16).long()
    counts = torch.bincount(pairs.reshape(-1), minlength=256).to(torch.float64)
    expected = pairs.numel() / 256
    statistic = float(((counts - expected) ** 2 / expected).sum())
    assert chi2_sf(statistic, 255) >= ALPHA


def test_distinct_streams_seeds_and_counters_differ() -> None:
    seeds = torch.tensor([0, 1, 2**32, -1, 2**32 + 1])
    counters = _grid(seeds, 64)
    base = counter_uniform(seeds, counters)
    for stream in (1, 2, 3):
        other = counter_uniform(seeds, counters, stream)
        assert float((other == base).to(torch.float64).mean()) < 0.01
    for i in range(seeds.shape[0]):
        for j in range(i):
            assert float((base[i] == base[j]).to(torch.float64).mean()) < 0.05
    high = counter_uniform(seeds, counters + 2**32)
    assert float((high == base).to(torch.float64).mean()) < 0.01
    shifted = counter_uniform(seeds, counters + 1)
    assert torch.equal(shifted[:, :-1], base[:, 1:])
    assert float((shifted == base).to(torch.float64).mean()) < 0.01


def test_streams_are_uncorrelated() -> None:
    """Sample correlation of streams 0 and 1 over 2**18 draws is below 5 standard errors."""
    seeds = torch.arange(256)
    counters = _grid(seeds, 1024)
    a = counter_uniform(seeds, counters, 0).view(-1)
    b = counter_uniform(seeds, counters, 1).view(-1)
    correlation = float(torch.corrcoef(torch.stack([a, b]))[0, 1])
    assert abs(correlation) < 5 / a.numel() ** 0.5


@pytest.mark.parametrize("stream", [-1, len(Stream)])
def test_stream_out_of_range_raises(stream: int) -> None:
    with pytest.raises(ValueError, match="stream"):
        counter_uniform(torch.tensor([1]), torch.zeros(1, 1, dtype=torch.int64), stream)


def test_seeding_mixes_seeded_generator_and_shared_rows() -> None:
    """Seeded rows read their counters, generator rows their generator, the rest the shared
    generator in row order: only they consume it."""
    seeding = Seeding.build(
        5,
        CPU,
        seeds=[5, None, 7, -1, None],
        generators={4: torch.Generator().manual_seed(3)},
        generator=torch.Generator().manual_seed(9),
    )
    counters = _grid(torch.zeros(5), 6)
    out = seeding.draw(CPU, [(Stream.ACCEPT, counters)])
    assert out.shape == (5, 6) and out.dtype == torch.float64
    own = counter_uniform(torch.tensor([5, 7]), counters[:2])
    assert torch.equal(out[[0, 2]], own)
    shared = torch.rand(2, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    assert torch.equal(out[[1, 3]], shared)
    mine = torch.rand(6, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    assert torch.equal(out[4], mine)


def test_seeding_with_device_seeds_gives_the_shared_numbers_in_row_order() -> None:
    """Seeds as a tensor (values unknown on the host): the same numbers as host seeds."""
    host = Seeding.build(4, CPU, seeds=[5, None, 7, None], generator=torch.Generator())
    device = Seeding.build(4, CPU, seeds=torch.tensor([5, -1, 7, -1]), generator=torch.Generator())
    counters = _grid(torch.zeros(4), 3)
    torch.manual_seed(0)
    host.generator.manual_seed(4)  # type: ignore[union-attr]
    a = host.draw(CPU, [(Stream.FINAL, counters)])
    device.generator.manual_seed(4)  # type: ignore[union-attr]
    b = device.draw(CPU, [(Stream.FINAL, counters)])
    assert torch.equal(a, b)


def test_seeding_refuses_a_row_with_seed_and_generator() -> None:
    with pytest.raises(ValueError, match="both a seed and a generator"):
        Seeding.build(2, CPU, seeds=[1, None], generators={0: torch.Generator()})
    with pytest.raises(ValueError, match="outside"):
        Seeding.build(2, CPU, generators={2: torch.Generator()})


def test_without_seeds_the_shared_generator_is_read_directly() -> None:
    seeding = Seeding.build(3, CPU, generator=torch.Generator().manual_seed(1))
    a = seeding.draw(CPU, [(Stream.ACCEPT, _grid(torch.zeros(3), 5))])
    b = torch.rand(3, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a, b)


def test_every_stream_has_its_own_key() -> None:
    seeds = torch.arange(8)
    counters = _grid(seeds, 64)
    draws = [counter_uniform(seeds, counters, s) for s in Stream]
    for i, a in enumerate(draws):
        for b in draws[i + 1 :]:
            assert float((a == b).to(torch.float64).mean()) < 0.01


@pytest.mark.parametrize("with_offsets", [False, True])
def test_seeded_row_is_batch_invariant(with_offsets: bool) -> None:
    """A seeded row gives the same output alone, first or last in a batch of 32."""
    family = make_family("markov", 4, vocab=8, seed=3)
    inputs = draw_inputs(family, rows=32, seed=4)
    others = draw_inputs(make_family("random", 4, vocab=8, seed=5), rows=31, seed=6)
    row = [t[:1] for t in inputs]
    seed = torch.tensor([424242])
    other_seeds = torch.cat([torch.arange(15) + 1, -torch.ones(16, dtype=torch.int64)])
    offset = torch.tensor([17]) if with_offsets else torch.tensor([0])
    other_offsets = torch.arange(31)

    def run(
        tensors: list[torch.Tensor], seeds: torch.Tensor, offsets: torch.Tensor
    ) -> torch.Tensor:
        at = offsets if with_offsets else torch.zeros_like(offsets)
        kwargs = {"seeds": seeds, "positions": at}
        return RejectionSampler()(*tensors, generator=torch.Generator().manual_seed(0), **kwargs)

    alone = run(row, seed, offset)
    first = run(
        [torch.cat([a, b]) for a, b in zip(row, others, strict=True)],
        torch.cat([seed, other_seeds]),
        torch.cat([offset, other_offsets]),
    )
    last = run(
        [torch.cat([b, a]) for a, b in zip(row, others, strict=True)],
        torch.cat([other_seeds, seed]),
        torch.cat([other_offsets, offset]),
    )
    assert torch.equal(first[:1], alone)
    assert torch.equal(last[-1:], alone)
    outputs = {tuple(run(row, torch.tensor([s]), offset)[0].tolist()) for s in range(200)}
    assert len(outputs) > 1, "the row's output must depend on its seed"


def test_positions_change_the_draws() -> None:
    inputs = draw_inputs(make_family("random", 4, vocab=8, seed=3), rows=256, seed=4)
    seeds = torch.arange(256)
    with pytest.raises(ValueError, match="seeds need positions"):
        RejectionSampler()(*inputs, seeds=seeds)
    a = RejectionSampler()(*inputs, seeds=seeds, positions=torch.zeros(256, dtype=torch.int64))
    b = RejectionSampler()(*inputs, seeds=seeds, positions=[0] * 256)
    c = RejectionSampler()(*inputs, seeds=seeds, positions=torch.full((256,), 5))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_host_seeds_take_every_64_bit_value() -> None:
    """Seeds in ``[2**63, 2**64)`` are accepted: their stream is the hash of their 64 bits.

    They are stored as the int64 of the same bits (negative), so a separate mask marks the
    counter-seeded rows; an unseeded row beside them still reads the shared generator.
    """
    from specsample import verify

    cpu = torch.device("cpu")
    seeds = [2**63, 2**64 - 1, None, 5]
    seeding = Seeding.build(4, cpu, seeds=seeds)
    assert seeding.counter_rows().tolist() == [True, True, False, True]
    counters = torch.zeros(4, 1, dtype=torch.int64)
    drawn = seeding.draw(cpu, [(Stream.FINAL, counters)])
    bits = torch.tensor([-(2**63), -1, 0, 5])
    expected = counter_uniform(bits, counters, Stream.FINAL)
    assert torch.equal(drawn[[0, 1, 3]], expected[[0, 1, 3]])
    logits = torch.randn(1, 64, generator=torch.Generator().manual_seed(0))
    none = torch.zeros(0, dtype=torch.int64)

    def first(seed: int) -> int:
        out = verify(logits, none, [0], temperature=1.0, seeds=[seed], positions=[0])
        return int(out.token_ids[0, 0])

    assert first(2**64 - 1) == first(2**64 - 1)
    assert [first(2**63 + s) for s in range(8)] != [first(s) for s in range(8)]
    with pytest.raises(ValueError, match=r"\[0, 2\*\*64\)"):
        verify(logits, none, [0], temperature=1.0, seeds=[2**64])


def test_a_request_generator_advances_alike_whatever_the_batch_width() -> None:
    """A request with a generator of its own, verified in two steps (1 draft, then 2) alone
    and beside a request with 5 drafts, gets the same tokens at both steps: its generator
    advances by as much at each step whatever the batch's padded width."""
    vocab = 6
    data = torch.Generator().manual_seed(0)
    steps = [
        (torch.randn(2, vocab, generator=data), [1]),
        (torch.randn(3, vocab, generator=data), [2, 3]),
    ]
    neighbour = torch.randn(6, vocab, generator=data)

    def run(seed: int, crowded: bool) -> list[list[int]]:
        own = torch.Generator().manual_seed(seed)
        tokens = []
        for logits, drafts in steps:
            ids, counts = drafts, [len(drafts)]
            if crowded:
                logits, ids, counts = (
                    torch.cat([logits, neighbour]),
                    [*drafts, 0, 1, 2, 3, 4],
                    [*counts, 5],
                )
            out = verify(logits, torch.tensor(ids), counts, temperature=1.0, generators={0: own})
            tokens.append(out.token_ids[0, : len(drafts) + 1].tolist())
        return tokens

    for seed in range(20):
        assert run(seed, crowded=False) == run(seed, crowded=True), seed
