"""The uniforms of a chain or block step: stripes of counters, never shared between steps,
and the two orders (drawn, and read by a rule) of the same numbers."""

from __future__ import annotations

import pytest
import torch

from specsample.random import STEP_STRIDE, Seeding
from specsample.uniforms import drawn_uniforms, in_step_order, step_uniforms, stripe

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
def test_drawn_uniforms_are_the_step_uniforms_final_draw_first(
    seeds: list[int | None] | None,
) -> None:
    """The same numbers from the same sources: the final draw first, the accept tests after."""
    k, at = 4, torch.tensor([0, 7, 300])
    got = []
    for draw in (drawn_uniforms, step_uniforms):
        gen = torch.Generator().manual_seed(5)
        seeding = Seeding.build(3, CPU, seeds=seeds, generator=gen)
        got.append(draw(seeding, k, CPU, positions=at))
    drawn, ordered = got
    assert torch.equal(in_step_order(drawn), ordered)
    assert torch.equal(drawn[:, 0], ordered[:, k])
    assert torch.equal(drawn[:, 1:], ordered[:, :k])
