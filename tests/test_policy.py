"""The adaptive draft-length policy (:mod:`specsample.generate.policy`): acceptance averages
(``acceptance``), the cost line (``costs``), the choice (``chooser``) and what runs carry over
to later ones (``memory``)."""

from __future__ import annotations

import pytest

from specsample.generate.policy import (
    AcceptanceTracker,
    CostModel,
    DraftLengthPolicy,
    History,
    PolicyMemory,
)
from specsample.generate.policy.acceptance import EXPLORE_EVERY, PRIOR_ACCEPTANCE, PRIOR_WEIGHT
from specsample.generate.policy.chooser import DRAFT_MARGIN, MARGIN
from specsample.generate.policy.costs import FRESH_FOR, TIMINGS_KEPT, TIMINGS_TO_TRUST


def test_tracker_observes_positions_up_to_the_first_rejection() -> None:
    tracker = AcceptanceTracker(2, 3)
    tracker.update([3, 3], [3, 1])
    assert all(a > PRIOR_ACCEPTANCE for a in tracker.rates[0])
    assert tracker.rates[1][0] > PRIOR_ACCEPTANCE
    assert tracker.rates[1][1] < PRIOR_ACCEPTANCE
    assert tracker.reached[1][2] == 0.0
    tracker.keep([1])
    tracker.add(1)
    assert len(tracker) == 2
    assert tracker.history > PRIOR_ACCEPTANCE
    assert tracker.rates[1] == [tracker.history] * 3


def test_a_position_never_reached_is_taken_for_the_one_before() -> None:
    """Unreached positions follow the last reached one, up (a drafter that always gets its
    first draft accepted) or down (one that never does)."""
    tracker = AcceptanceTracker(2, 3)
    for _ in range(30):
        tracker.update([1, 3], [1, 0])
    good, bad = tracker.rates
    assert good[0] > 0.8 and tracker.reached[0][1:] == [0.0, 0.0]
    assert good[1] == good[2] == good[0]
    assert bad[0] < 0.2 and bad[1] == bad[2] == bad[0]


def test_estimates_leave_the_prior_once_observations_outweigh_it() -> None:
    """One rejection moves the estimate by less than half; twice the prior's weight in
    rejections halves it; many acceptances bring it near 1."""
    tracker = AcceptanceTracker(1, 1)
    tracker.update([1], [0])
    assert tracker.rates[0][0] > PRIOR_ACCEPTANCE / 2
    for _ in range(int(2 * PRIOR_WEIGHT) - 1):
        tracker.update([1], [0])
    assert tracker.rates[0][0] < PRIOR_ACCEPTANCE / 2
    tracker = AcceptanceTracker(1, 1)
    for _ in range(60):
        tracker.update([1], [1])
    assert tracker.rates[0][0] > 0.9


def test_trackers_sharing_a_history_start_from_what_earlier_ones_saw() -> None:
    """A tracker's first drafts update the shared counts, and a later tracker's sequences
    start from them, not from the prior; the prior still counts, so the rate stays above 0."""
    shared = History()
    earlier = AcceptanceTracker(2, 2, shared)
    for _ in range(30):
        earlier.update([2, 2], [0, 0])
    assert shared.seen > 2 * PRIOR_WEIGHT
    later = DraftLengthPolicy(k_max=2, batch=3, history=shared).acceptance
    assert later.history == shared.rate < PRIOR_ACCEPTANCE / 4
    assert later.rates == [[shared.rate] * 2] * 3
    assert shared.rate > 0.0
    assert AcceptanceTracker(1, 2).history == PRIOR_ACCEPTANCE


def test_expected_tokens_is_one_plus_the_products() -> None:
    tracker = AcceptanceTracker(1, 2)
    tracker.accepted = tracker.reached = [[PRIOR_WEIGHT, PRIOR_WEIGHT]]
    tracker.first.hits, tracker.first.seen = -PRIOR_WEIGHT * PRIOR_ACCEPTANCE, 0.0
    assert tracker.rates[0] == pytest.approx([0.5, 0.75])
    assert tracker.expected_tokens() == pytest.approx([1.0, 1.5, 1.5 + 0.5 * 0.75])


def test_expected_tokens_count_no_draft_past_a_limit() -> None:
    """A sequence gains nothing from drafts past its limit (its budget, or no proposal)."""
    tracker = AcceptanceTracker(3, 3)
    full = tracker.expected_tokens()
    one = AcceptanceTracker(1, 3).expected_tokens()
    capped = tracker.expected_tokens([3, 1, 0])
    assert capped[0] == 3.0
    assert capped[1] == pytest.approx(3.0 + 2 * (one[1] - 1.0))
    assert capped[3] == pytest.approx(full[3] - 2 * (one[3] - 1.0) + (one[1] - 1.0))


def test_policy_never_drafts_past_what_a_sequence_can_keep() -> None:
    """The length never exceeds the roomiest sequence's budget left minus one, nor drafts
    for sequences with nothing to propose; their acceptance is then not observed."""
    policy = DraftLengthPolicy(k_max=4, batch=2)
    assert policy.choose(room=[3, 2]) == 2
    assert policy.choose(room=[1, 1]) == 0
    assert policy.choose(drafting=[False, False]) == 0
    before = [list(row) for row in policy.acceptance.reached]
    policy.record(4, [2, 0], 0.02, 0.004, offered=[4, 0])
    assert policy.acceptance.reached[1] == before[1]
    assert policy.acceptance.reached[0][:3] == [1.0, 1.0, 1.0]


def _timed(*steps: tuple[int, int, float]) -> CostModel:
    """A cost model that observed each ``(batch, width, seconds)`` of the target's side."""
    cost = CostModel()
    for batch, width, seconds in steps:
        cost.observe_target(batch, width, seconds)
    return cost


def test_cost_line_interpolates_and_extrapolates() -> None:
    cost = _timed((1, 2, 1.0), (1, 6, 2.0), (1, 8, 4.0))
    assert cost.target_time(1, 4) == pytest.approx(1.5)
    assert cost.target_time(1, 10) == pytest.approx(6.0)
    assert cost.target_time(1, 1) == pytest.approx(0.75)
    assert cost.draft_time(3) == 0.0
    cost.observe_draft(2, 0.5)
    assert cost.draft_time(5) == pytest.approx(0.5)


def test_a_batch_size_without_a_curve_borrows_the_nearest_one() -> None:
    """Scaled to agree with the one width it has measured, if any."""
    cost = _timed((8, 1, 0.010), (8, 5, 0.030), (2, 1, 0.004), (1, 1, 0.003), (1, 5, 0.003))
    assert cost.target_time(6, 3) == pytest.approx(0.020)
    assert cost.target_time(2, 5) == pytest.approx(0.004)
    assert cost.target_time(4, 1) == pytest.approx(0.003)


def test_timings_are_the_fastest_of_the_recent_ones() -> None:
    """A slow first step counts only until the next ones push it out; a slow one in between
    does not count."""
    cost = CostModel()
    cost.observe_target(4, 2, 0.500)
    assert cost.target_time(4, 2) == pytest.approx(0.500)
    for seconds in (0.012, 0.011, 0.400, 0.013):
        cost.observe_target(4, 2, seconds)
    assert cost.target_time(4, 2) == pytest.approx(0.011)
    for _ in range(TIMINGS_KEPT):
        cost.observe_target(4, 2, 0.020)
    assert cost.target_time(4, 2) == pytest.approx(0.020)


def test_the_longest_length_is_timed_again_once_its_timings_are_old() -> None:
    """After FRESH_FOR steps without one, a step of k_max is timed again at that scale; its
    old timings keep their estimate meanwhile."""
    cost = _timed((4, 3, 0.030), (4, 3, 0.031), (4, 1, 0.010), (4, 1, 0.010))
    cost.observe_target(4, 2, 0.02)
    cost.observe_target(4, 2, 0.02)
    assert cost.fresh(5, 3) and not cost.fresh(8, 3)
    for _ in range(FRESH_FOR - 3):
        cost.observe_target(4, 1, 0.010)
    assert not cost.fresh(4, 3) and cost.fresh(4, 2)
    assert cost.tried == {(2, 3), (1, 3), (0, 3)}
    assert cost.target_time(4, 3) == pytest.approx(0.030)
    policy = DraftLengthPolicy(k_max=2, batch=4, cost=cost)
    assert policy.choose() == 2 and policy.exploring == 2
    policy.record(2, [0] * 4, target_seconds=0.03, draft_seconds=0.0)
    assert policy.exploring == 2 and policy.choose() == 0 and policy.exploring is None


def test_policy_tries_every_length_then_follows_acceptance() -> None:
    policy = DraftLengthPolicy(k_max=4, batch=1)
    tried = []
    for _ in range(5 * TIMINGS_TO_TRUST):
        m = policy.choose()
        tried.append(m)
        policy.record(m, [min(m, 1)], target_seconds=0.01 + 0.0025 * m, draft_seconds=0.001 * m)
    assert tried == [m for m in (4, 0, 3, 2, 1) for _ in range(TIMINGS_TO_TRUST)]
    for _ in range(20):
        policy.record(4, [4], target_seconds=0.02, draft_seconds=0.004)
    assert policy.choose() == 4
    for _ in range(30):
        policy.record(4, [0], target_seconds=0.02, draft_seconds=0.004)
    assert policy.choose() == 0


def test_explorations_grow_rarer_while_drafting_does_not_pay() -> None:
    """Every exploration the policy does not follow up doubles the interval to the next;
    each drafts one token more than the best length (here a plain step)."""
    policy = DraftLengthPolicy(k_max=2, batch=1)
    for _ in range(TIMINGS_TO_TRUST):
        policy.record(2, [0], target_seconds=0.05, draft_seconds=0.01)
        policy.record(0, [0], target_seconds=0.01, draft_seconds=0.0)
        policy.record(1, [0], target_seconds=0.03, draft_seconds=0.01)
    explored = []
    for step in range(200):
        m = policy.choose()
        policy.record(m, [0], target_seconds=0.05 if m else 0.01, draft_seconds=0.01 * m)
        if m:
            explored.append((step, m))
    first = EXPLORE_EVERY
    second = first + 2 * EXPLORE_EVERY + 1
    assert explored == [(first, 1), (second, 1), (second + 4 * EXPLORE_EVERY + 1, 1)]


def test_runs_sharing_a_history_continue_its_exploration_schedule() -> None:
    """A later run with the same History and timings waits as long as the schedule had
    grown to, counting the shorter steps the earlier run left, rather than exploring after
    EXPLORE_EVERY steps again; a fresh History starts over."""
    shared, cost = History(), _timed((1, 3, 0.05), (1, 3, 0.05), (1, 1, 0.01), (1, 1, 0.01))
    for _ in range(TIMINGS_TO_TRUST):
        cost.observe_target(1, 2, 0.03)
    cost.observe_draft(1, 0.01)

    def explorations(history: History, steps: int) -> list[int]:
        policy = DraftLengthPolicy(k_max=2, batch=1, cost=cost, history=history)
        explored = []
        for step in range(steps):
            m = policy.choose()
            policy.record(m, [0], target_seconds=0.05 if m else 0.01, draft_seconds=0.01 * m)
            if m:
                explored.append(step)
        return explored

    assert explorations(shared, 3 * EXPLORE_EVERY) == [EXPLORE_EVERY]
    left = 2 * EXPLORE_EVERY - (3 * EXPLORE_EVERY - EXPLORE_EVERY - 1)
    assert shared.explore_after == 2 * EXPLORE_EVERY and shared.shorter == 2 * EXPLORE_EVERY - 1
    assert explorations(shared, 3 * EXPLORE_EVERY) == [left]
    assert explorations(History(), 3 * EXPLORE_EVERY) == [EXPLORE_EVERY]


def test_a_plain_step_needs_no_margin_a_shorter_draft_does() -> None:
    """Drafts that never pay lose to a plain step even when they cost only a little more;
    a length between 0 and k_max must beat k_max by MARGIN."""
    policy = DraftLengthPolicy(k_max=2, batch=1)
    for _ in range(TIMINGS_TO_TRUST):
        for m in (2, 0, 1):
            policy.record(m, [0], target_seconds=0.010 * (1 + 0.06 * m), draft_seconds=0.0)
    for _ in range(30):
        policy.record(2, [0], target_seconds=0.0106, draft_seconds=0.0)
    assert policy.choose() == 0
    policy = DraftLengthPolicy(k_max=2, batch=1)
    for _ in range(TIMINGS_TO_TRUST):
        policy.record(2, [2], target_seconds=0.0110, draft_seconds=0.0)
        policy.record(0, [0], target_seconds=0.0100, draft_seconds=0.0)
        policy.record(1, [1], target_seconds=0.0075, draft_seconds=0.0)
    assert policy.choose() == 2


def _with_first_rate(rate: float, k_max: int, *widths: float) -> DraftLengthPolicy:
    """A policy of one sequence whose drafts pass at ``rate``, with the target's side of a
    step timed at ``widths[m]`` seconds for ``m`` drafts (drafting itself costless)."""
    history = History()
    history.seen = 1000.0
    history.hits = rate * (history.seen + PRIOR_WEIGHT) - PRIOR_WEIGHT * PRIOR_ACCEPTANCE
    policy = DraftLengthPolicy(k_max=k_max, batch=1, history=history)
    for m, seconds in enumerate(widths):
        for _ in range(TIMINGS_TO_TRUST):
            policy.cost.observe_target(1, m + 1, seconds)
    assert policy.acceptance.rates[0][0] == pytest.approx(rate)
    return policy


def test_drafting_must_beat_a_plain_step_by_a_margin() -> None:
    """A step that drafts at the cost of a plain one is chosen only when it is expected to
    emit DRAFT_MARGIN more; k_max within MARGIN of the best length is not chosen when it
    would not beat a plain step by DRAFT_MARGIN itself."""
    assert _with_first_rate(DRAFT_MARGIN / 2, 1, 0.010, 0.010).choose() == 0
    assert _with_first_rate(2 * DRAFT_MARGIN, 1, 0.010, 0.010).choose() == 1
    policy = _with_first_rate(2 * DRAFT_MARGIN, 2, 0.010, 0.010, 0.0107)
    rates = [
        tokens / policy.cost.target_time(1, m + 1)
        for m, tokens in enumerate(policy.acceptance.expected_tokens())
    ]
    assert rates[1] <= (1 + MARGIN) * rates[2] and rates[2] < rates[0]
    assert policy.choose() == 1


def test_policy_refuses_a_negative_maximum() -> None:
    with pytest.raises(ValueError, match="k_max"):
        DraftLengthPolicy(k_max=-1, batch=1)


def test_a_later_run_starts_from_the_timings_of_earlier_ones() -> None:
    """Lengths timed at about a batch size are not tried again; another size is tried."""
    first = DraftLengthPolicy(k_max=2, batch=4)
    for _ in range(3 * TIMINGS_TO_TRUST):
        m = first.choose()
        first.record(m, [m] * 4, target_seconds=0.01 + 0.001 * m, draft_seconds=0.001 * m)
    assert first.cost.tried == {(2, 3), (0, 3), (1, 3)}
    again = DraftLengthPolicy(k_max=2, batch=5, cost=first.cost)
    assert again.choose() == 2 and again.exploring is None
    wider = DraftLengthPolicy(k_max=2, batch=64, cost=first.cost)
    assert wider.choose() == 2 and wider.exploring == 2


def test_runs_given_one_memory_share_their_timings() -> None:
    """And the acceptance of their first drafts, apart for greedy and sampled runs; a run
    given no memory starts fresh, a decoder's calls share its own."""
    transformers = pytest.importorskip("transformers")
    from specsample.generate import Decoder, NGramDrafter, speculative_generate

    config = transformers.LlamaConfig(
        vocab_size=40,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        max_position_embeddings=64,
    )
    target = transformers.LlamaForCausalLM(config).eval()
    prompts = [[1, 2, 3, 1, 2]] * 2
    memory = PolicyMemory()
    speculative_generate(target, prompts, NGramDrafter(), k=2, max_new_tokens=6, memory=memory)
    (costs,) = memory.costs[target].values()
    tried = set(costs.tried)
    assert tried
    (history,) = memory.histories[target].values()
    seen = history.seen
    assert seen > 0
    speculative_generate(target, prompts, NGramDrafter(), k=2, max_new_tokens=6, memory=memory)
    assert list(memory.costs[target].values()) == [costs]
    assert costs.tried >= tried
    assert list(memory.histories[target].values()) == [history]
    assert history.seen > seen
    speculative_generate(
        target, prompts, NGramDrafter(), k=2, max_new_tokens=6, temperature=1.0, memory=memory
    )
    assert list(memory.costs[target].values()) == [costs]
    assert len(memory.histories[target]) == 2
    seen, steps = history.seen, costs.steps
    speculative_generate(target, prompts, NGramDrafter(), k=2, max_new_tokens=6)
    assert (history.seen, costs.steps) == (seen, steps)
    decoder = Decoder(target, NGramDrafter(), k=2)
    decoder.generate(prompts, max_new_tokens=6)
    (own,) = decoder.memory.costs[target].values()
    assert own is not costs
    steps = own.steps
    decoder.generate(prompts, max_new_tokens=6)
    assert list(decoder.memory.costs[target].values()) == [own] and own.steps > steps
    with pytest.raises(TypeError, match="memory"):
        Decoder(target, NGramDrafter(), memory={})  # type: ignore[arg-type]
