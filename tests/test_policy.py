"""The adaptive draft-length policy: acceptance averages, the cost line, the choice."""

from __future__ import annotations

import pytest

from specsample.generate.policy import (
    PRIOR_ACCEPTANCE,
    AcceptanceTracker,
    CostModel,
    DraftLengthPolicy,
)


def test_tracker_observes_positions_up_to_the_first_rejection() -> None:
    tracker = AcceptanceTracker(2, 3)
    tracker.update([3, 3], [3, 1])
    assert all(a > PRIOR_ACCEPTANCE for a in tracker.rates[0])
    assert tracker.rates[1][0] > PRIOR_ACCEPTANCE
    assert tracker.rates[1][1] < PRIOR_ACCEPTANCE
    assert tracker.rates[1][2] == PRIOR_ACCEPTANCE
    tracker.keep([1])
    tracker.add(1)
    assert len(tracker.rates) == 2 and tracker.rates[1] == tracker.history
    assert tracker.history[0] > PRIOR_ACCEPTANCE > tracker.history[1]


def test_expected_tokens_is_one_plus_the_products() -> None:
    tracker = AcceptanceTracker(1, 2)
    tracker.rates = [[0.5, 0.5]]
    assert tracker.expected_tokens(0) == 1.0
    assert tracker.expected_tokens(2) == pytest.approx(1.0 + 0.5 + 0.25)


def test_cost_line_interpolates_and_extrapolates() -> None:
    cost = CostModel()
    cost.observe_target(1, 1.0)
    cost.observe_target(3, 2.0)
    assert cost.target_time(2) == pytest.approx(1.5)
    assert cost.target_time(5) == pytest.approx(3.0)


def test_policy_explores_both_ends_then_follows_acceptance() -> None:
    policy = DraftLengthPolicy(k_max=4, batch=1)
    assert policy.choose() == 4
    policy.record(4, [4], target_seconds=0.02, draft_seconds=0.004)
    assert policy.choose() == 0
    policy.record(0, [0], target_seconds=0.01, draft_seconds=0.0)
    for _ in range(20):
        policy.record(4, [4], target_seconds=0.02, draft_seconds=0.004)
    assert policy.choose() == 4
    for _ in range(30):
        policy.record(4, [0], target_seconds=0.02, draft_seconds=0.004)
    assert policy.choose() == 0


def test_policy_refuses_a_negative_maximum() -> None:
    with pytest.raises(ValueError, match="k_max"):
        DraftLengthPolicy(k_max=-1, batch=1)


def test_stats_count_only_the_drafts_offered() -> None:
    """With adaptive lengths a position is offered in fewer forwards than were run."""
    from specsample.generate.stats import GenerationStats

    stats = GenerationStats(
        "speculative", "model", "chain", 2, 1, 6, 1.0, 4, 4, (2, 1, 1), offered_by_position=(2, 1)
    )
    assert stats.proposed == 3
    assert stats.acceptance_rate == 1.0
    assert stats.acceptance_by_position == [1.0, 1.0]
    merged = stats.merge(stats)
    assert merged.offered_by_position == (4, 2) and merged.acceptance_rate == 1.0
