"""Counters and metrics: of verification (:mod:`specsample.stats`) and of a generation run.

Covers :mod:`specsample.stats` and :mod:`specsample.generate.stats` (the
:class:`GenerationStats` a run reports: merged runs, the table and the dictionary).
"""

from __future__ import annotations

import math

import pytest
import torch

from specsample.generate import GenerationStats
from specsample.sampler import RejectionSampler
from specsample.stats import VerificationStats, expected_acceptance
from specsample.testing import draw_inputs, make_family


def test_expected_acceptance_examples() -> None:
    q = torch.tensor([0.2, 0.8])
    p = torch.tensor([0.6, 0.4])
    assert float(expected_acceptance(q, p)) == pytest.approx(0.6)
    assert float(expected_acceptance(q, q)) == pytest.approx(1.0)
    disjoint = expected_acceptance(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0]))
    assert float(disjoint) == 0.0


def test_expected_acceptance_shape_and_dtype() -> None:
    generator = torch.Generator().manual_seed(0)
    q = torch.rand(2, 3, 5, generator=generator)
    p = torch.rand(2, 3, 5, generator=generator)
    out = expected_acceptance(q, p)
    assert out.shape == (2, 3) and out.dtype == torch.float32
    assert torch.allclose(out, torch.minimum(q, p).sum(dim=-1))
    half = expected_acceptance(q.to(torch.bfloat16), p.to(torch.bfloat16))
    assert half.dtype == torch.float32 and half.shape == (2, 3)


def test_expected_acceptance_is_one_minus_total_variation() -> None:
    generator = torch.Generator().manual_seed(1)
    q = torch.rand(50, 20, generator=generator, dtype=torch.float64)
    p = torch.rand(50, 20, generator=generator, dtype=torch.float64)
    q, p = q / q.sum(-1, keepdim=True), p / p.sum(-1, keepdim=True)
    tv = 0.5 * (q - p).abs().sum(dim=-1)
    assert torch.allclose(expected_acceptance(q, p).double(), 1 - tv, atol=1e-6)


def test_fresh_stats_are_empty() -> None:
    stats = VerificationStats()
    assert stats.steps == 0 and stats.drafted == 0
    assert int(stats.accepted) == 0 and int(stats.emitted) == 0
    assert math.isnan(stats.acceptance_rate)
    assert math.isnan(stats.mean_tokens_per_step)
    assert math.isnan(stats.expected_acceptance_rate)
    assert stats.position_acceptance_rate == []


def test_update_and_metrics() -> None:
    stats = VerificationStats()
    stats.update(torch.tensor([2, 0]), k=3)
    assert stats.steps == 2 and stats.drafted == 6
    assert int(stats.accepted) == 2 and int(stats.emitted) == 4
    assert stats.acceptance_rate == pytest.approx(2 / 6)
    assert stats.mean_tokens_per_step == pytest.approx(2.0)
    assert stats.accepted_per_position.tolist() == [1, 1, 0]
    assert stats.position_acceptance_rate == pytest.approx([0.5, 0.5, 0.0])
    stats.update(torch.tensor([5, 1, 3]), k=5)
    assert stats.accepted_per_position.tolist() == [4, 3, 2, 1, 1]
    stats.update(torch.tensor([1]), k=1)
    assert stats.accepted_per_position.tolist() == [5, 3, 2, 1, 1]
    assert stats.steps == 6 and stats.drafted == 6 + 15 + 1
    assert int(stats.accepted) == 2 + 9 + 1
    assert int(stats.emitted) == int(stats.accepted) + stats.steps
    summary = stats.summary()
    assert summary["steps"] == 6 and summary["accepted"] == 12 and summary["emitted"] == 18
    assert summary["acceptance_rate"] == pytest.approx(12 / 22)
    assert summary["mean_tokens_per_step"] == pytest.approx(3.0)
    assert summary["position_acceptance_rate"] == pytest.approx([5 / 6, 3 / 6, 2 / 6, 1 / 6, 1 / 6])
    expected_rate = summary["expected_acceptance_rate"]
    assert isinstance(expected_rate, float) and math.isnan(expected_rate)


def test_update_with_k_zero() -> None:
    stats = VerificationStats()
    stats.update(torch.zeros(4, dtype=torch.int64), k=0)
    assert stats.steps == 4 and stats.drafted == 0 and int(stats.emitted) == 4
    assert math.isnan(stats.acceptance_rate)
    assert stats.mean_tokens_per_step == 1.0


def test_record_expected() -> None:
    stats = VerificationStats()
    q = torch.tensor([[[0.2, 0.8], [0.5, 0.5]]])
    p = torch.tensor([[[0.6, 0.4], [0.5, 0.5]]])
    stats.record_expected(q, p)
    assert stats.expected_positions == 2
    assert stats.expected_acceptance_rate == pytest.approx((0.6 + 1.0) / 2)
    stats.record_expected(q[:, :1], p[:, :1])
    assert stats.expected_acceptance_rate == pytest.approx((0.6 + 1.0 + 0.6) / 3)


def test_reset_and_to() -> None:
    stats = VerificationStats()
    stats.update(torch.tensor([1, 2]), k=2)
    stats.record_expected(torch.ones(1, 1, 2) / 2, torch.ones(1, 1, 2) / 2)
    assert stats.to("cpu") is stats
    stats.reset()
    assert stats.steps == 0 and stats.drafted == 0 and stats.expected_positions == 0
    assert int(stats.accepted) == 0 and int(stats.emitted) == 0
    assert stats.accepted_per_position.numel() == 0
    assert math.isnan(stats.expected_acceptance_rate)
    assert stats.accepted.device.type == "cpu"


def test_realised_acceptance_matches_the_expectation() -> None:
    """With k = 1 each row is accepted with probability ``a_i = sum_x min(q_i, p_i)``.

    The realised count minus ``sum a_i``, over its standard deviation
    ``sqrt(sum a_i (1 - a_i))``, stays below 5 in absolute value: false-failure rate
    about 6e-7; over 20_000 rows a bias of 0.018 in the acceptance rate fails with
    probability >= 99%.
    """
    target, bonus, draft, ids = draw_inputs(make_family("random", 1, seed=2), rows=20_000, seed=2)
    sampler = RejectionSampler()
    sampler.stats.record_expected(target, draft)
    sampler(target, bonus, draft, ids, generator=torch.Generator().manual_seed(0))
    a = expected_acceptance(target, draft).double().view(-1)
    z = (float(sampler.num_accepted_tokens) - float(a.sum())) / float((a * (1 - a)).sum()) ** 0.5
    assert abs(z) < 5
    assert sampler.stats.expected_acceptance_rate == pytest.approx(float(a.mean()), rel=1e-6)
    assert abs(sampler.stats.acceptance_rate - sampler.stats.expected_acceptance_rate) < 0.02


def test_stats_table_and_merge() -> None:
    a = GenerationStats("speculative", "n-gram", "chain", 2, 1, 6, 0.5, 3, 3, (1, 1, 1))
    b = GenerationStats("speculative", "n-gram", "chain", 2, 2, 4, 0.5, 2, 4, (2, 2, 0))
    merged = a.merge(b)
    assert (merged.sequences, merged.tokens, merged.steps) == (3, 10, 5)
    assert merged.accepted_counts == (3, 3, 1)
    assert merged.acceptance_by_position == pytest.approx([4 / 7, 1 / 7])
    assert merged.tokens_per_s == pytest.approx(10.0)
    table = merged.format_table()
    for label in ("tokens/s", "acceptance rate", "acceptance by position", "forwards saved"):
        assert label in table
    assert merged.as_dict()["target_forwards_saved"] == 3


def test_stats_table_shows_a_dash_where_a_rate_is_undefined() -> None:
    """A position never drafted has no acceptance: ``-``, never ``nan``."""
    counts, offered = (0, 2, 0, 0), (2, 2, 0)
    stats = GenerationStats("speculative", "model", "chain", 3, 1, 4, 0.0, 2, 2, counts, offered)
    table = stats.format_table()
    rows = dict(line.split("  ", 1) for line in table.splitlines())
    assert "nan" not in table
    assert rows["acceptance by position"].strip() == "1.000 0.000 -"
    assert rows["tokens/s"].strip() == "-" and rows["target steps (batched)"].strip() == "2 (-/s)"


def test_stats_count_only_the_drafts_offered() -> None:
    """With adaptive lengths a position is offered in fewer forwards than were run."""
    stats = GenerationStats(
        "speculative", "model", "chain", 2, 1, 6, 1.0, 4, 4, (2, 1, 1), offered_by_position=(2, 1)
    )
    assert stats.proposed == 3
    assert stats.acceptance_rate == 1.0
    assert stats.acceptance_by_position == [1.0, 1.0]
    merged = stats.merge(stats)
    assert merged.offered_by_position == (4, 2) and merged.acceptance_rate == 1.0
