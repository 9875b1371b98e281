"""Block verification: exact enumeration, the paper's toy, the harness, and the API paths.

Statistical tests: the exactness reports run at ``ALPHA = 1e-4`` per case (Bonferroni over
their ``k + 3`` tests) and detect a total variation >= 0.0123 at output position 0 with
probability >= 99%; the logits path's two chi-square tests at 1e-5 each (2e-5 together)
detect a first-token TV above about 0.012; the paper toy's mean accepted count has a
false-failure rate below 1e-5 with the two rules' expectations 50 standard errors apart.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from specsample import RejectionSampler, verify
from specsample.rules.block import block_length, block_weights
from specsample.testing import FAMILIES, Family, exactness_report, make_family

ALPHA = 1e-4


def _residual(row: torch.Tensor, scale: float, draft: torch.Tensor) -> torch.Tensor:
    mass = (scale * row - draft).clamp(min=0.0)
    total = float(mass.sum())
    return mass / total if total > 0 else row


def _block_step_law(family: Family) -> dict[tuple[int, ...], float]:
    """Exact law of the tokens one block-verification step emits, in float64.

    Written for enumeration, independently of the library: every draft sequence with its
    probability, every accepted length with ``P(tau = i | x) = h_i prod_{j > i}(1 - h_j)``,
    then every final token from the residual ``max(w_tau q_tau - p_tau, 0)`` or the bonus row.
    """
    q = family.reference()
    p = family.draft.to(torch.float64)
    p = p / p.sum(-1, keepdim=True)
    k, vocab = family.k, family.vocab
    law: dict[tuple[int, ...], float] = {}
    for drafts in itertools.product(range(vocab), repeat=k):
        context = [family.start, *drafts]
        prob, w, weights = 1.0, 1.0, [1.0]
        for j, x in enumerate(drafts):
            prob *= float(p[j, context[j], x])
            ratio = float(q[j, context[j], x]) / float(p[j, context[j], x]) if prob > 0 else 0.0
            w = min(1.0, w * ratio)
            weights.append(w)
        if prob == 0.0:
            continue
        h = []
        for i in range(1, k + 1):
            if i == k:
                h.append(weights[k])
                continue
            z = float((weights[i] * q[i, context[i]] - p[i, context[i]]).clamp(min=0).sum())
            den = z + 1.0 - weights[i]
            h.append(z / den if den > 0 else 0.0)
        for tau in range(k + 1):
            p_tau = h[tau - 1] if tau else 1.0
            for j in range(tau + 1, k + 1):
                p_tau *= 1.0 - h[j - 1]
            if p_tau == 0.0:
                continue
            if tau == k:
                final = q[k, context[k]]
            else:
                final = _residual(q[tau, context[tau]], weights[tau], p[tau, context[tau]])
            for y in range(vocab):
                mass = prob * p_tau * float(final[y])
                if mass > 0:
                    key = (*drafts[:tau], y)
                    law[key] = law.get(key, 0.0) + mass
    return law


@pytest.mark.parametrize("name", ["random", "markov", "sparse", "peaked"])
def test_block_step_is_exact_by_enumeration(name: str) -> None:
    """For every prefix ``s`` of length ``n``, ``P(O_n = y | O_<n = s, n emitted) = q_n(y | s)``.

    This conditional criterion is necessary and sufficient for the emitted stream to follow
    the target (algorithms note, section 7.3). Exact arithmetic in float64: error < 1e-12.
    The Markov rows depend on the position and on the previous token, so a residual or
    ``Z_i`` read from the wrong row would show up here.
    """
    family = make_family(name, k=3, vocab=4, seed=5)
    law = _block_step_law(family)
    assert math.isclose(sum(law.values()), 1.0, abs_tol=1e-12)
    q = family.reference()
    worst = 0.0
    for n in range(family.k + 1):
        prefixes = {key[:n] for key in law if len(key) > n}
        for prefix in prefixes:
            nxt = torch.zeros(family.vocab, dtype=torch.float64)
            for key, mass in law.items():
                if len(key) > n and key[:n] == prefix:
                    nxt[key[n]] += mass
            context = prefix[-1] if n else family.start
            worst = max(worst, float((nxt / nxt.sum() - q[n, context]).abs().max()))
    assert worst < 1e-12


def test_block_expected_length_matches_the_enumerated_law() -> None:
    """The harness' exact law of the accepted length agrees with the independent enumeration."""
    family = make_family("markov", k=3, vocab=4, seed=2)
    law = _block_step_law(family)
    mean = sum((len(key) - 1) * mass for key, mass in law.items())
    lengths = torch.arange(family.k + 1, dtype=torch.float64)
    assert math.isclose(
        float((family.accepted_length_law("block") * lengths).sum()), mean, abs_tol=1e-12
    )


def _toy(rows: int) -> tuple[torch.Tensor, ...]:
    target = torch.tensor([1 / 3, 2 / 3])
    draft = torch.tensor([2 / 3, 1 / 3])
    generator = torch.Generator().manual_seed(11)
    ids = torch.multinomial(draft, rows * 2, replacement=True, generator=generator).view(rows, 2)
    bonus = torch.multinomial(target, rows, replacement=True, generator=generator).view(rows, 1)
    return target.expand(rows, 2, 2), bonus, draft.expand(rows, 2, 2), ids


@pytest.mark.parametrize(("method", "expected"), [("chain", 10 / 9), ("block", 11 / 9)])
def test_paper_toy_expected_accepted_tokens(method: str, expected: float) -> None:
    """Sun et al.'s toy (binary vocabulary, q = (1/3, 2/3), p = (2/3, 1/3), k = 2).

    Token-wise verification accepts 10/9 tokens in expectation, block verification 11/9. With
    200k rows the standard error of the mean is below 0.0021; the tolerance 4.5 standard
    errors has a false-failure rate below 1e-5 and the two expectations are 50 errors apart.
    """
    rows = 200_000
    target, bonus, draft, ids = _toy(rows)
    sampler = RejectionSampler(method=method)
    torch.manual_seed(3)
    sampler(target, bonus, draft, ids)
    mean = float(sampler.num_accepted_tokens) / rows
    lengths = sampler.stats.length_histogram.to(torch.float64)
    spread = math.sqrt(float((lengths * (torch.arange(3) - mean) ** 2).sum()) / rows / rows)
    assert abs(mean - expected) < 4.5 * spread


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("k", [1, 3, 5])
def test_block_passes_the_harness(name: str, k: int) -> None:
    """Every family, through the harness, against the block rule's exact acceptance law.

    100k rows, per-test false-failure rate 1e-4 (Bonferroni over k + 3 tests); position 0
    detects any TV >= 0.0123 with 99% power (see ``ExactnessReport.detectable_tv``).
    """
    family = make_family(name, k=k, seed=k)
    report = exactness_report(
        RejectionSampler(method="block"), family, rows=100_000, seed=k, rule="block"
    )
    assert report.passed(ALPHA), report.format(ALPHA)


@pytest.mark.parametrize("name", FAMILIES)
def test_block_never_accepts_fewer_tokens_in_expectation(name: str) -> None:
    """Exact expectations: block >= token-wise on every family, and > where k >= 2 can gain."""
    family = make_family(name, k=4, seed=1)
    lengths = torch.arange(family.k + 1, dtype=torch.float64)
    block = float((family.accepted_length_law("block") * lengths).sum())
    chain = float((family.accepted_length_law("chain") * lengths).sum())
    assert block >= chain - 1e-12
    if name in ("random", "markov", "peaked", "sparse"):
        assert block > chain + 1e-3


def test_block_weights_and_length_rules() -> None:
    """``tau`` is the LAST position that passes, not the one before the first failure."""
    q = torch.tensor([[0.2, 0.9, 0.9]], dtype=torch.float64)
    p = torch.tensor([[0.4, 0.9, 0.9]], dtype=torch.float64)
    weights = block_weights(q, p, torch.ones(1, 3, dtype=torch.bool))
    assert weights.tolist() == [[1.0, 0.5, 0.5, 0.5]]
    z = torch.tensor([[0.0, 0.1, 0.1]], dtype=torch.float64)
    eta = torch.tensor([[0.99, 0.99, 0.1]], dtype=torch.float64)
    assert block_length(weights, z, torch.tensor([3]), eta).tolist() == [3]
    invalid = block_weights(q, p, torch.tensor([[True, False, True]]))
    assert invalid[0, 2:].tolist() == [0.0, 0.0]
    assert block_length(
        invalid, z, torch.tensor([3]), torch.zeros(1, 3, dtype=torch.float64)
    ).tolist() == [1]


def _flat_family_inputs(family: Family, rows: int) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(7)
    k = family.k
    prev = torch.full((rows,), family.start)
    logits, drafts, draft_probs = [], [], []
    for j in range(k):
        logits.append(family.target[j, prev].log())
        draft_probs.append(family.draft[j, prev])
        prev = torch.multinomial(family.draft[j, prev], 1, generator=generator).squeeze(-1)
        drafts.append(prev)
    logits.append(family.target[k, prev].log())
    target = torch.stack(logits, dim=1).reshape(rows * (k + 1), -1)
    draft_rows = torch.stack(draft_probs, 1).reshape(-1, family.vocab)
    return target, torch.stack(drafts, 1).reshape(-1), draft_rows


def test_verify_block_matches_the_exact_first_token_law() -> None:
    """``verify(method="block")`` on logits: first two emitted tokens against the target.

    Chi-square per position over 100k rows at level 1e-5 each (two tests: family-wise 2e-5);
    detects any first-token TV above about 0.012 with 99% power.
    """
    family = make_family("markov", k=3, vocab=6, seed=4)
    rows = 100_000
    target, drafts, draft_probs = _flat_family_inputs(family, rows)
    torch.manual_seed(5)
    out = verify(target, drafts, [3] * rows, draft_probs=draft_probs, method="block")
    q = family.reference()
    first = torch.bincount(out.token_ids[:, 0], minlength=6).to(torch.float64)
    expected = q[0, family.start] * rows
    statistic = float(((first - expected) ** 2 / expected.clamp(min=1e-12))[expected > 0].sum())
    assert statistic < 40.0  # chi-square, 5 df: P(X > 40) < 2e-7
    lengths = out.num_emitted - 1
    law = family.accepted_length_law("block")
    mean = float((law * torch.arange(4)).sum())
    assert abs(float(lengths.double().mean()) - mean) < 0.02


def test_verify_block_refuses_one_hot_drafts() -> None:
    logits = torch.randn(3, 5)
    with pytest.raises(ValueError, match="draft_probs or draft_logits"):
        verify(logits, torch.tensor([1, 2]), [2], method="block")


def test_block_greedy_rows_follow_the_argmax() -> None:
    logits = torch.randn(2 * 4, 7)
    argmax = logits.argmax(-1).view(2, 4)
    drafts = torch.stack(
        [argmax[0, :3], torch.tensor([argmax[1, 0], (argmax[1, 1] + 1) % 7, argmax[1, 2]])]
    )
    out = verify(
        logits,
        drafts.reshape(-1),
        [3, 3],
        draft_probs=torch.softmax(torch.randn(6, 7), -1),
        temperature=[0.0, 0.0],
        method="block",
    )
    assert out.token_ids[0].tolist() == argmax[0].tolist()
    assert out.token_ids[1].tolist() == [int(argmax[1, 0]), int(argmax[1, 1]), -1, -1]
