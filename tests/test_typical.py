"""Typical acceptance (Medusa): the rule on hand-made rows, and proof that it is not exact.

Covers :mod:`specsample.rules.typical`; the PyTorch backend's typical step on logits
(:mod:`specsample.backends.lossy`) is tested in ``tests/test_params.py``.

The sampling test runs at level ``ALPHA = 1e-4`` (its false-failure rate) and detects a
deviation of TV >= 0.0082 from the rule's own law with probability >= 99% (asserted).
"""

from __future__ import annotations

import inspect
import math

import numpy as np
import pytest
import torch
from scipy.stats import entropy as scipy_entropy

from specsample.rules.typical import (
    DEFAULT_POSTERIOR_ALPHA,
    DEFAULT_POSTERIOR_THRESHOLD,
    entropy,
    typical_acceptance,
    typical_first_token_distribution,
    typical_first_token_tv,
    typical_threshold,
)
from specsample.testing import chi2_sf, detectable_tv

ALPHA = 1e-4


def _dirichlet(shape: tuple[int, ...], vocab: int, seed: int) -> torch.Tensor:
    rows = np.random.default_rng(seed).dirichlet([0.5] * vocab, size=shape)
    return torch.from_numpy(rows / rows.sum(-1, keepdims=True))


def test_defaults_are_medusas() -> None:
    assert DEFAULT_POSTERIOR_THRESHOLD == 0.09
    assert DEFAULT_POSTERIOR_ALPHA == 0.3
    for function in (typical_acceptance, typical_threshold, typical_first_token_distribution):
        parameters = inspect.signature(function).parameters
        assert parameters["posterior_threshold"].default == 0.09
        assert parameters["posterior_alpha"].default == 0.3


def test_entropy_matches_scipy() -> None:
    rows = _dirichlet((50,), 7, seed=0)
    rows[:10, 3] = 0.0
    rows = rows / rows.sum(-1, keepdim=True)
    expected = scipy_entropy(rows.numpy(), axis=-1)
    assert np.allclose(entropy(rows).numpy(), expected, rtol=0, atol=1e-12)
    assert entropy(torch.tensor([1.0, 0.0, 0.0])).item() == 0.0
    assert math.isclose(entropy(torch.full((8,), 0.125)).item(), math.log(8), rel_tol=1e-6)
    assert entropy(rows.float()).dtype == torch.float32


def test_threshold_formula() -> None:
    rows = _dirichlet((40,), 5, seed=1)
    h = scipy_entropy(rows.numpy(), axis=-1)
    for eps, alpha in ((0.09, 0.3), (0.2, 0.5), (0.05, 0.01)):
        expected = np.minimum(eps, alpha * np.exp(-h))
        got = typical_threshold(rows, eps, alpha).numpy()
        assert np.allclose(got, expected, rtol=0, atol=1e-12)
    assert math.isclose(typical_threshold(torch.full((1, 4), 0.25)).item(), 0.075, rel_tol=1e-6)
    assert math.isclose(typical_threshold(torch.tensor([[0.0, 1.0]])).item(), 0.09, rel_tol=1e-6)


def test_uniform_target_accepts_everything() -> None:
    vocab, k = 8, 4
    target = torch.full((3, k + 1, vocab), 1.0 / vocab)
    target[:, k] = torch.tensor([0.1, 0.1, 0.1, 0.3, 0.1, 0.1, 0.1, 0.1])
    drafts = torch.randint(0, vocab, (3, k), generator=torch.Generator().manual_seed(0))
    out = typical_acceptance(target, drafts)
    assert out.num_accepted.tolist() == [k] * 3
    assert torch.equal(out.token_ids[:, :k], drafts)
    assert out.token_ids[:, k].tolist() == [3] * 3


def test_one_hot_target_accepts_only_its_token() -> None:
    vocab, k = 5, 3
    target = torch.zeros(4, k + 1, vocab)
    target[:, 0, 2] = 1.0
    target[:, 1, 4] = 1.0
    target[:, 2, 0] = 1.0
    target[:, 3, 1] = 1.0
    drafts = torch.tensor([[2, 4, 0], [2, 4, 3], [1, 4, 0], [2, 0, 0]])
    out = typical_acceptance(target, drafts)
    assert out.num_accepted.tolist() == [3, 2, 0, 1]
    assert out.token_ids.tolist() == [[2, 4, 0, 1], [2, 4, 0, -1], [2, -1, -1, -1], [2, 4, -1, -1]]


def test_threshold_is_strict_and_invalid_ids_rejected() -> None:
    target = torch.tensor([[[0.09, 0.91], [0.5, 0.5]]], dtype=torch.float64)
    assert typical_threshold(target[:, 0]).item() == 0.09
    assert typical_acceptance(target, torch.tensor([[0]])).num_accepted.tolist() == [0]
    assert typical_acceptance(target, torch.tensor([[0]])).token_ids.tolist() == [[1, -1]]
    assert typical_acceptance(target, torch.tensor([[1]])).num_accepted.tolist() == [1]
    for bad in (-1, 2):
        out = typical_acceptance(target, torch.tensor([[bad]]))
        assert out.num_accepted.tolist() == [0] and out.token_ids.tolist() == [[1, -1]]


def test_no_drafts_emits_the_bonus_argmax() -> None:
    target = torch.tensor([[[0.2, 0.7, 0.1]], [[0.6, 0.3, 0.1]]])
    out = typical_acceptance(target, torch.zeros(2, 0, dtype=torch.int64))
    assert out.token_ids.tolist() == [[1], [0]] and out.num_accepted.tolist() == [0, 0]


def test_matches_a_plain_loop() -> None:
    batch, k, vocab = 300, 4, 6
    target = _dirichlet((batch, k + 1), vocab, seed=2)
    drafts = torch.randint(0, vocab, (batch, k), generator=torch.Generator().manual_seed(3))
    for eps, alpha in ((0.09, 0.3), (0.3, 0.6)):
        out = typical_acceptance(target, drafts, posterior_threshold=eps, posterior_alpha=alpha)
        for b in range(batch):
            emitted: list[int] = []
            for j in range(k + 1):
                row = target[b, j].numpy()
                threshold = min(eps, alpha * math.exp(-scipy_entropy(row)))
                if j < k and row[int(drafts[b, j])] > threshold:
                    emitted.append(int(drafts[b, j]))
                    continue
                emitted.append(int(np.argmax(row)))
                break
            assert out.token_ids[b].tolist() == emitted + [-1] * (k + 1 - len(emitted))
            assert int(out.num_accepted[b]) == len(emitted) - 1


def test_first_token_law_by_hand() -> None:
    q = torch.tensor([0.05, 0.15, 0.8], dtype=torch.float64)
    p = torch.tensor([0.5, 0.25, 0.25], dtype=torch.float64)
    law = typical_first_token_distribution(q, p)
    assert torch.allclose(law, torch.tensor([0.0, 0.25, 0.75], dtype=torch.float64))
    assert math.isclose(typical_first_token_tv(q, law).item(), 0.1, abs_tol=1e-12)
    one_hot = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    one_hot_law = typical_first_token_distribution(one_hot, p)
    assert typical_first_token_tv(one_hot, one_hot_law).item() == 0.0


def test_typical_acceptance_is_not_exact() -> None:
    """On Dirichlet toys the induced first-token law is far from the target.

    Sampled drafts (draft ``p`` independent of ``q``) and a deterministic top-1 drafter
    both give a clearly positive TV; the mean over 64 rows exceeds 0.05 for either.
    """
    q = _dirichlet((64,), 8, seed=4)
    p = _dirichlet((64,), 8, seed=5)
    sampled = typical_first_token_tv(q, typical_first_token_distribution(q, p))
    top1 = torch.nn.functional.one_hot(p.argmax(-1), 8).to(torch.float64)
    greedy_draft = typical_first_token_tv(q, typical_first_token_distribution(q, top1))
    assert bool((sampled >= 0).all()) and bool((sampled <= 1).all())
    assert float(sampled.mean()) > 0.05 and float(greedy_draft.mean()) > 0.05
    assert float(typical_first_token_tv(q, typical_first_token_distribution(q, q)).mean()) > 0.0


def test_sampled_first_token_follows_the_helper_not_the_target() -> None:
    """200_000 one-draft steps on one toy row: the emitted token follows the helper's law.

    Chi-square at level 1e-4 (df <= 7); a deviation of TV >= 0.0082 from the helper's law is
    detected with probability >= 99%. The same counts tested against the target itself give a
    p-value below 1e-12: the rule is measurably not exact.
    """
    rows, vocab = 200_000, 8
    q = _dirichlet((1,), vocab, seed=6)[0]
    p = _dirichlet((1,), vocab, seed=7)[0]
    g = torch.Generator().manual_seed(8)
    drafts = torch.multinomial(p, rows, replacement=True, generator=g).view(rows, 1)
    target = torch.stack([q, q]).expand(rows, 2, vocab)
    out = typical_acceptance(target, drafts)
    counts = torch.bincount(out.token_ids[:, 0], minlength=vocab).to(torch.float64)
    law = typical_first_token_distribution(q, p)
    support = law > 0
    assert counts[~support].sum().item() == 0
    expected = law[support] * rows
    statistic = float(((counts[support] - expected) ** 2 / expected).sum())
    df = int(support.sum()) - 1
    assert chi2_sf(statistic, df) >= ALPHA
    assert detectable_tv(rows, df, ALPHA) <= 0.0082
    target_expected = q * rows
    against_target = float(((counts - target_expected) ** 2 / target_expected).sum())
    assert chi2_sf(against_target, vocab - 1) < 1e-12


def test_validation() -> None:
    target = torch.full((2, 3, 4), 0.25)
    drafts = torch.zeros(2, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="target_probs"):
        typical_acceptance(target[0], drafts)
    with pytest.raises(TypeError, match="target_probs"):
        typical_acceptance(target.long(), drafts)
    with pytest.raises(TypeError, match="target_probs"):
        typical_acceptance(target.tolist(), drafts)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="draft_token_ids"):
        typical_acceptance(target, drafts[:, :1])
    with pytest.raises(TypeError, match="draft_token_ids"):
        typical_acceptance(target, drafts.float())
    with pytest.raises(ValueError, match="posterior_threshold"):
        typical_acceptance(target, drafts, posterior_threshold=-0.1)
    with pytest.raises(ValueError, match="posterior_alpha"):
        typical_acceptance(target, drafts, posterior_alpha=math.nan)
    with pytest.raises(TypeError, match="posterior_alpha"):
        typical_acceptance(target, drafts, posterior_alpha=True)
    with pytest.raises(ValueError, match="draft_probs"):
        typical_first_token_distribution(target[0, 0], torch.full((3,), 1 / 3))
    with pytest.raises(ValueError, match="law"):
        typical_first_token_tv(target[0, 0], torch.full((3,), 1 / 3))
