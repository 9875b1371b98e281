"""The uniforms of a chain or block step: stripes of counters, never shared between steps,
and the one order a rule reads them in."""

from __future__ import annotations

import pytest
import torch

from specsample.params.seeding import Seeding
from specsample.random import STEP_STRIDE, Stream
from specsample.uniforms import step_uniforms, stripe

CPU = torch.device("cpu")


def test_stripes_shift_the_counters() -> None:
    counters = stripe(torch.tensor([0, 3]), 2, 4, STEP_STRIDE, CPU)
    assert counters[1].tolist() == [3 * STEP_STRIDE + j for j in range(4)]
    with pytest.raises(ValueError, match="at most"):
        stripe(None, 1, STEP_STRIDE + 1, STEP_STRIDE, CPU)


def test_steps_at_increasing_positions_never_share_a_number() -> None:
    """Block verification's accepted length depends on every ``eta_i`` of its step, even
    those after it, so no number of one step may be reused by a later one: a step at a
    larger position draws from a disjoint stripe of counters."""
    seeding = Seeding.build(1, CPU, seeds=[77])
    k = 6
    seen: set[float] = set()
    for position in range(0, 40, 3):
        u = step_uniforms(seeding, k, CPU, positions=torch.tensor([position]))
        values = set(u[0].tolist())
        assert not values & seen
        seen |= values


@pytest.mark.parametrize("seeds", [None, [3, None, 9]], ids=["generator", "mixed"])
def test_uniforms_are_the_accept_tests_then_the_final_draw(
    seeds: list[int | None] | None,
) -> None:
    """A generator's numbers are read with the first one (the final draw) last; counter rows
    read the accept tests' stream, then the final draw's."""
    k, at = 4, torch.tensor([0, 7, 300])
    gen = torch.Generator().manual_seed(5)
    got = step_uniforms(Seeding.build(3, CPU, seeds=seeds, generator=gen), k, CPU, positions=at)
    shared = [0, 1, 2] if seeds is None else [1]
    first = torch.rand(len(shared), k + 1, dtype=torch.float64, generator=gen.manual_seed(5))
    assert torch.equal(got[shared], first.roll(-1, dims=1))
    if seeds is not None:
        seeding = Seeding.build(3, CPU, seeds=seeds)
        accept = seeding.draw(CPU, [(Stream.ACCEPT, stripe(at, 3, k, STEP_STRIDE, CPU))])
        final = seeding.draw(CPU, [(Stream.FINAL, stripe(at, 3, 1, 1, CPU))])
        assert torch.equal(got[[0, 2], :k], accept[[0, 2]])
        assert torch.equal(got[[0, 2], k], final[[0, 2], 0])


def test_a_rows_own_generator_gives_its_final_draw_first_whatever_the_width() -> None:
    """A row with a generator of its own reads that generator's first number as its final
    draw and the next ones as its accept tests, at any padded width of the batch."""
    for k in (1, 3, 6):
        own = torch.Generator().manual_seed(9)
        seeding = Seeding.build(2, CPU, generators={1: own})
        got = step_uniforms(seeding, k, CPU)[1]
        numbers = torch.rand(k + 1, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
        assert torch.equal(got[k], numbers[0])
        assert torch.equal(got[:k], numbers[1:])
