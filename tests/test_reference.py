"""The naive reference verifier: output layout, edge cases, validation, and a cheap exactness check.

Agreement in distribution with the fast sampler is tested elsewhere (through
:mod:`specsample.testing`); here one small-vocabulary chi-square test per output position
checks that the reference itself emits the target distribution.

False failures: each per-position test runs at level ``CHI2_LEVEL = 1e-6`` (<= 2e-6 in all);
the position-0 test (100_000 rows, df <= 5) detects a total variation >= 0.0127 with
probability >= 99%.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from specsample.testing.reference import naive_rejection_sample

CHI2_LEVEL = 1e-6
"""Per-test level: with two tests, a correct reference fails with probability <= 2e-6."""


def _layout_ok(out: torch.Tensor, drafts: torch.Tensor, vocab: int) -> bool:
    """Accepted drafts, then one token in ``[0, vocab)``, then only ``-1``."""
    k = drafts.shape[1]
    length = (out != -1).sum(dim=1)
    cols = torch.arange(k + 1)
    emitted = cols < length.unsqueeze(-1)
    accepted = cols[:k] < (length - 1).unsqueeze(-1)
    return bool(
        (length >= 1).all()
        & torch.where(emitted, (out >= 0) & (out < vocab), out == -1).all()
        & (~accepted | (out[:, :k] == drafts)).all()
    )


def _random_rows(batch: int, k: int, vocab: int, gen: torch.Generator) -> torch.Tensor:
    return torch.softmax(2.0 * torch.randn(batch, k, vocab, generator=gen), dim=-1)


def test_layout_on_random_inputs() -> None:
    gen = torch.Generator().manual_seed(0)
    batch, k, vocab = 64, 5, 11
    q, p = _random_rows(batch, k, vocab, gen), _random_rows(batch, k, vocab, gen)
    drafts = torch.multinomial(p.view(-1, vocab), 1, generator=gen).view(batch, k)
    bonus = torch.randint(vocab, (batch, 1), generator=gen)
    out = naive_rejection_sample(q, bonus, p, drafts, generator=gen)
    assert out.shape == (batch, k + 1) and out.dtype == torch.int64
    assert _layout_ok(out, drafts, vocab)
    full = (out != -1).all(dim=1)
    assert torch.equal(out[full, k], bonus[full, 0])


def test_equal_rows_accept_everything_and_emit_the_bonus() -> None:
    gen = torch.Generator().manual_seed(1)
    q = _random_rows(4, 3, 7, gen)
    drafts = torch.multinomial(q.view(-1, 7), 1, generator=gen).view(4, 3)
    bonus = torch.tensor([0, 6, 2, 5])
    out = naive_rejection_sample(q, bonus, q.clone(), drafts, generator=gen)
    assert torch.equal(out, torch.cat([drafts, bonus.unsqueeze(-1)], dim=1))


def test_zero_target_draft_is_rejected_and_residual_is_used() -> None:
    q = torch.tensor([[[0.0, 0.0, 0.0, 1.0], [0.25, 0.25, 0.25, 0.25]]]).expand(50, 2, 4)
    p = torch.full((50, 2, 4), 0.25)
    drafts = torch.tensor([[1, 2]]).expand(50, 2)
    out = naive_rejection_sample(q, torch.zeros(50, 1, dtype=torch.int64), p, drafts)
    assert torch.equal(out, torch.tensor([[3, -1, -1]]).expand(50, 3))


def test_out_of_vocab_drafts_are_rejected() -> None:
    q = torch.tensor([[[0.0, 1.0], [0.5, 0.5]]])
    drafts = torch.tensor([[-1, 0]])
    out = naive_rejection_sample(q, torch.tensor([[0]]), q.clone(), drafts)
    assert out.tolist() == [[1, -1, -1]]


def test_residual_without_mass_falls_back_to_the_target_row() -> None:
    """``q <= p`` everywhere (unnormalised ``q = p / 2``): rejected rows draw from ``q``."""
    rows = 2000
    p = torch.tensor([0.2, 0.8, 0.0, 0.0]).expand(rows, 1, 4)
    q = p / 2
    drafts = torch.ones(rows, 1, dtype=torch.int64)
    gen = torch.Generator().manual_seed(2)
    out = naive_rejection_sample(q, torch.full((rows, 1), 3), p, drafts, generator=gen)
    rejected = out[:, 1] == -1
    assert 0 < int(rejected.sum()) < rows
    recovered = out[rejected, 0]
    assert bool(((recovered == 0) | (recovered == 1)).all())
    assert bool((recovered == 0).any())


def test_k_zero_emits_the_bonus_token() -> None:
    q = torch.empty(3, 0, 5)
    out = naive_rejection_sample(q, torch.tensor([4, 0, 2]), q, torch.empty(3, 0, dtype=torch.long))
    assert out.tolist() == [[4], [0], [2]]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_other_dtypes_keep_the_layout(dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(3)
    q = _random_rows(16, 3, 9, gen).to(dtype)
    p = _random_rows(16, 3, 9, gen).to(dtype)
    drafts = torch.multinomial(p.view(-1, 9).double(), 1, generator=gen).view(16, 3)
    out = naive_rejection_sample(q, torch.zeros(16, dtype=torch.int32), p, drafts, generator=gen)
    assert _layout_ok(out, drafts, 9)


def test_generator_makes_the_output_reproducible() -> None:
    gen = torch.Generator().manual_seed(4)
    q, p = _random_rows(32, 4, 10, gen), _random_rows(32, 4, 10, gen)
    drafts = torch.multinomial(p.view(-1, 10), 1, generator=gen).view(32, 4)
    bonus = torch.zeros(32, 1, dtype=torch.int64)
    first = naive_rejection_sample(q, bonus, p, drafts, generator=torch.Generator().manual_seed(9))
    again = naive_rejection_sample(q, bonus, p, drafts, generator=torch.Generator().manual_seed(9))
    assert torch.equal(first, again)


def test_invalid_inputs_raise() -> None:
    q = torch.full((2, 3, 4), 0.25)
    ids = torch.zeros(2, 3, dtype=torch.int64)
    bonus = torch.zeros(2, 1, dtype=torch.int64)
    with pytest.raises(ValueError, match="draft_probs"):
        naive_rejection_sample(q, bonus, torch.full((2, 2, 4), 0.25), ids)
    with pytest.raises(ValueError, match="draft_token_ids"):
        naive_rejection_sample(q, bonus, q, ids[:, :2])
    with pytest.raises(TypeError, match="target_probs"):
        naive_rejection_sample(q.tolist(), bonus, q, ids)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="draft_token_ids"):
        naive_rejection_sample(q, bonus, q, ids.float())


def test_emitted_tokens_follow_the_target() -> None:
    """Chi-square tests of the first two emitted tokens against the target rows.

    Position 0 uses all ``N = 100_000`` rows; the draft proposes a token the target forbids
    (``q = 0``, ``p = 0.25``), so the residual carries 45% of the mass. Position 1 is emitted
    when draft 0 was accepted (about 55_000 rows) and must follow ``q_1``, whatever draft 0
    was. Each test runs at level 1e-6 (false-failure rate <= 2e-6 in all; the seed is fixed,
    so the outcome is deterministic). With df <= 5 and N = 100_000 the position-0 test
    detects, with probability >= 99%, any deviation of total variation >= 0.0127 (from the
    non-central chi-square law: N * chi2-divergence >= 64.5 and divergence >= 4 TV^2).
    A token of zero target probability must never be emitted.
    """
    rows, vocab = 100_000, 6
    q0 = torch.tensor([0.30, 0.25, 0.20, 0.15, 0.10, 0.00])
    p0 = torch.tensor([0.05, 0.10, 0.15, 0.20, 0.25, 0.25])
    q1 = torch.tensor([0.05, 0.40, 0.05, 0.20, 0.10, 0.20])
    p1 = torch.tensor([0.30, 0.10, 0.20, 0.10, 0.20, 0.10])
    q = torch.stack([q0, q1]).expand(rows, 2, vocab)
    p = torch.stack([p0, p1]).expand(rows, 2, vocab)
    gen = torch.Generator().manual_seed(12345)
    drafts = torch.multinomial(p.reshape(-1, vocab), 1, generator=gen).view(rows, 2)
    bonus = torch.zeros(rows, 1, dtype=torch.int64)
    out = naive_rejection_sample(q, bonus, p, drafts, generator=gen)
    assert _layout_ok(out, drafts, vocab)

    for position, target in ((0, q0), (1, q1)):
        tokens = out[:, position][out[:, position] != -1]
        counts = torch.bincount(tokens, minlength=vocab).to(torch.float64)
        assert int(counts[target == 0].sum()) == 0
        support = target > 0
        expected = target[support].double() * counts.sum() / target[support].double().sum()
        p_value = chisquare(counts[support].numpy(), expected.numpy()).pvalue
        assert p_value >= CHI2_LEVEL, (position, counts.tolist(), p_value)
