"""Statistical exactness of the chain verifier, through :mod:`specsample.testing`.

Covers the statistical harness :mod:`specsample.testing` (``families``, ``simulation``,
``report``, ``chisquare``) as the exactness suites use it.

Every case below simulates ``ROWS = 100_000`` sequences and asserts
``report.passed(ALPHA)`` with ``ALPHA = 1e-4``: the report's ``k + 1`` per-position chi-square
tests and its two z-tests (acceptance of draft position 0, mean accepted count) each run at
level ``1e-4 / (k + 3)`` (Bonferroni), so a correct verifier fails a case with probability at
most 1e-4 (for a fresh seed; the seeds here are fixed, so the suite is deterministic).

Power, computed with the non-central chi-square law (:func:`specsample.testing.detectable_tv`):
at output position 0 all 100_000 rows enter one context with at most 7 degrees of freedom;
at level ``1e-4 / (k + 3)`` the test then fails with probability >= 99% once the
non-centrality ``N * D`` reaches 58.2 (k=1) to 60.5 (k=5), where ``D`` is the chi-square
divergence of the emitted law from the target. As ``D >= 4 TV^2`` for any deviation, every
deviation of total variation >= 0.0123 at position 0 is caught with probability >= 99%
(0.0103 to 0.0123 for the smaller df of sparse rows); deviations concentrated on one
low-probability token are caught far below that. Later positions see fewer rows ``N_n`` and
pool up to 8 contexts (df up to 56): there the bound on the count-weighted mean TV is
0.016 * sqrt(100_000 / N_n) (0.029 at N_n = 30_000). The acceptance z-test (|z| < 4.21 at
k=1 to 4.37 at k=5) detects a shift of (4.37 + 2.33) * sqrt(a (1 - a) / N) <= 0.0106 in
the acceptance probability ``a`` of position 0 with probability >= 99%.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from specsample.rules.chain import emit
from specsample.sampler import RejectionSampler
from specsample.testing import FAMILIES, draw_inputs, exactness_report, make_family

ROWS = 100_000
ALPHA = 1e-4
STATED_TV = 0.0123
"""Largest TV at position 0 that the chi-square test can miss with probability > 1%."""


@pytest.mark.parametrize("k", [1, 3, 5])
@pytest.mark.parametrize("name", FAMILIES)
def test_rejection_sampler_is_exact(name: str, k: int) -> None:
    """The real sampler passes every family and draft length.

    False-failure rate <= 1e-4; a deviation of TV >= 0.0123 at position 0 (>= 0.016 *
    sqrt(100_000 / N_n) in mean TV at position n) is detected with probability >= 99%.
    The one-hot target family has no degrees of freedom: there any emitted token other than
    the target's (probability zero) fails the test deterministically.
    """
    family = make_family(name, k, seed=17 * k + 1)
    report = exactness_report(RejectionSampler(), family, rows=ROWS, seed=1000 + k)
    assert report.passed(ALPHA), str(report)
    assert report.malformed_rows == 0
    if report.positions[0].df:
        assert report.detectable_tv(0, ALPHA) <= STATED_TV


def _residual_tokens(
    target: torch.Tensor, draft: torch.Tensor, uniform: torch.Tensor
) -> torch.Tensor:
    """Inverse-CDF draw from ``normalize(max(0, target - draft))`` per row, ``[b, vocab]``."""
    residual = (target.to(torch.float64) - draft.to(torch.float64)).clamp(min=0.0)
    empty = residual.sum(dim=-1, keepdim=True) <= 0
    residual = torch.where(empty, target.to(torch.float64), residual)
    cum = residual.cumsum(dim=-1)
    total = cum[:, -1:].contiguous()
    x = uniform.unsqueeze(-1) * total
    last_positive = torch.searchsorted(cum, total, right=False)
    return torch.minimum(torch.searchsorted(cum, x, right=True), last_positive).squeeze(-1)


def _scaffold(accept_factor: float, residual_shift: int):
    """A hand-written chain verifier, correct for ``(1.0, 0)`` and wrong otherwise.

    ``accept_factor`` scales the target in the accept test ``u * p < factor * q``;
    ``residual_shift`` reads the residual ``shift`` positions before the rejected one.
    """

    def verifier(
        target_probs: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
    ) -> torch.Tensor:
        batch, k, _ = target_probs.shape
        u = torch.rand(batch, k + 1, dtype=torch.float64)
        ids = draft_token_ids.unsqueeze(-1)
        q_at = target_probs.gather(2, ids).squeeze(-1).to(torch.float64)
        p_at = draft_probs.gather(2, ids).squeeze(-1).to(torch.float64)
        accepted = u[:, :k] * p_at < accept_factor * q_at
        num_accepted = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)
        position = (num_accepted - residual_shift).clamp(0, k - 1)
        rows = torch.arange(batch)
        token = _residual_tokens(target_probs[rows, position], draft_probs[rows, position], u[:, k])
        last = torch.where(num_accepted == k, bonus_token_ids.view(batch), token)
        return emit(draft_token_ids, num_accepted, last)

    return verifier


correct_scaffold = _scaffold(1.0, 0)
over_accepting = _scaffold(1.02, 0)
"""Accepts when ``u * p < 1.02 * q``: 2% too often where ``q < p``."""
residual_off_by_one = _scaffold(1.0, 1)
"""Samples the residual of the position before the rejected one (position 0 stays right)."""

OVER_ACCEPTING_FIXTURE = ("onehot_draft", 3, 2, 52)
"""(family, k, vocab, seed): greedy one-hot drafts whose target probability is large."""
OFF_BY_ONE_FIXTURE = ("markov", 3, 8, 52)
"""(family, k, vocab, seed): rows that change with position and context."""


def _family(fixture: tuple[str, int, int, int]):
    name, k, vocab, seed = fixture
    return make_family(name, k, vocab=vocab, seed=seed)


@pytest.mark.parametrize(
    "fixture", [OVER_ACCEPTING_FIXTURE, OFF_BY_ONE_FIXTURE], ids=["onehot_draft-v2", "markov"]
)
@pytest.mark.parametrize(
    "verifier", [correct_scaffold, RejectionSampler()], ids=["scaffold", "sampler"]
)
def test_correct_verifiers_pass_bug_fixtures(verifier, fixture) -> None:
    """Control: on the fixtures below, the real sampler and the unbroken scaffold pass.

    So the failures below come from the planted bugs, not from the fixtures or the
    scaffold. False-failure rate <= 1e-4 each; power as in the module docstring (TV >= 0.0122
    at position 0 detected with probability >= 99%; at vocab 2, df = 1, TV >= 0.0105).
    """
    report = exactness_report(verifier, _family(fixture), rows=ROWS, seed=7)
    assert report.passed(ALPHA), str(report)


def test_harness_rejects_over_accepting_verifier() -> None:
    """Accepting with ``u * p < 1.02 * q`` fails with the settings the real sampler passes.

    The drafts are one-hot at the target's mode ``x`` with ``a = q_0(x | start) = 0.848``
    (vocab 2), so the acceptance probability of position 0 rises from ``a`` to ``1.02 a``:
    an expected z-score of ``0.02 sqrt(N a / (1 - a)) = 14.9`` against a threshold of 4.31,
    missed with probability < 1e-20; the emitted law at position 0 also moves by
    TV = 0.02 a (non-centrality ``0.0004 N a / (1 - a) = 223`` at df 1).
    """
    family = _family(OVER_ACCEPTING_FIXTURE)
    a = family.expected_acceptance()
    assert 0.02 * (ROWS * a / (1 - a)) ** 0.5 > 14
    report = exactness_report(over_accepting, family, rows=ROWS, seed=7)
    assert not report.passed(ALPHA), str(report)
    assert report.acceptance_z > report.z_threshold(ALPHA), str(report)


def test_harness_rejects_residual_off_by_one() -> None:
    """Reading the residual one position early fails with the same settings.

    Position 0 is unaffected (it clamps to row 0); at positions 1 and 2 the token after a
    rejection comes from the residual of the previous position's row, which for the
    Markov family (independent Dirichlet(0.3) rows per position and context) is a TV of
    order 0.3 given a rejection: chi-square statistics in the 10^5 against critical values
    near 100.
    """
    report = exactness_report(residual_off_by_one, _family(OFF_BY_ONE_FIXTURE), rows=ROWS, seed=7)
    assert not report.passed(ALPHA), str(report)
    assert report.positions[0].p_value >= report.p_value_threshold(ALPHA)
    assert report.positions[1].p_value < report.p_value_threshold(ALPHA)


def test_batch_one_calls_match_batched_seeded_rows() -> None:
    """Seeded rows verified one at a time give the batched output, row for row."""
    inputs = draw_inputs(make_family("markov", 3, seed=5), rows=256, seed=9)
    seeds = torch.arange(256, dtype=torch.int64) * 7919 + 12345
    sampler = RejectionSampler()
    at = torch.zeros_like(seeds)
    batched = sampler(*inputs, seeds=seeds, positions=at)
    singles = torch.cat(
        [
            sampler(*(t[i : i + 1] for t in inputs), seeds=seeds[i : i + 1], positions=at[:1])
            for i in range(256)
        ]
    )
    assert torch.equal(batched, singles)


def test_exactness_with_batch_one_calls() -> None:
    """Batch-1 calls (a loop over rows) are exact too, on fewer rows.

    False-failure rate <= 1e-4. With 4_000 rows the power is lower: TV >= 0.061 at
    position 0 is detected with probability >= 99%.
    The seeded test above ties batch-1 outputs to the batched ones, which pass at full power.
    """
    family = make_family("markov", 3, seed=5)
    report = exactness_report(RejectionSampler(), family, rows=4000, seed=3, batch_size=1)
    assert report.passed(ALPHA), str(report)


# ----------------------------------------------------------------------------------------
# The harness itself
# ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FAMILIES)
def test_families_are_valid(name: str) -> None:
    family = make_family(name, 3, vocab=7, seed=2)
    assert family.target.shape == (4, 7, 7) and family.draft.shape == (3, 7, 7)
    assert family.target.dtype == torch.float32 and family.draft.dtype == torch.float32
    for table in (family.target, family.draft):
        assert bool((table >= 0).all())
        assert torch.allclose(table.sum(dim=-1), torch.ones(()), atol=1e-6)
    target = family.target[:3]
    if name == "sparse":
        assert bool(((target == 0) & (family.draft > 0)).any())
        assert bool(((target > 0) & (family.draft == 0)).any())
    if name == "equal":
        assert torch.equal(target, family.draft)
    if name == "onehot_draft":
        assert bool((family.draft.max(dim=-1).values == 1).all())
    if name == "onehot_target":
        assert bool((family.target.max(dim=-1).values == 1).all())
    if name == "markov":
        assert float((family.target[1] - family.target[2]).abs().max()) > 0.5
        assert float((family.target[1, 0] - family.target[1, 1]).abs().max()) > 0.3


def test_family_rejects_bad_tables() -> None:
    family = make_family("random", 2, vocab=4)
    with pytest.raises(ValueError, match="draft"):
        type(family)("x", family.target, family.draft[:1])
    with pytest.raises(ValueError, match="target"):
        type(family)("x", family.target[:, :, :3], family.draft)
    with pytest.raises(ValueError, match="start"):
        type(family)("x", family.target, family.draft, start=4)
    with pytest.raises(ValueError, match="name"):
        make_family("nope", 2)
    with pytest.raises(ValueError, match="k"):
        make_family("random", 0)


def test_exact_acceptance_law_by_enumeration() -> None:
    """``prefix_acceptance`` agrees with brute-force enumeration of every draft chain."""
    family = make_family("markov", 3, vocab=4, seed=8)
    q = family.reference()
    p = family.draft.to(torch.float64)
    p = p / p.sum(dim=-1, keepdim=True)
    expected = [1.0, 0.0, 0.0, 0.0]

    def walk(j: int, prev: int, prob: float) -> None:
        for x in range(4):
            accepted = prob * min(float(q[j, prev, x]), float(p[j, prev, x]))
            expected[j + 1] += accepted
            if j + 1 < 3:
                walk(j + 1, x, accepted)

    walk(0, family.start, 1.0)
    assert torch.allclose(family.prefix_acceptance(), torch.tensor(expected, dtype=torch.float64))


def test_harness_is_deterministic_and_leaves_the_global_rng_alone() -> None:
    family = make_family("random", 2, seed=1)
    state = torch.get_rng_state()
    first = exactness_report(RejectionSampler(), family, rows=3000, seed=4)
    assert torch.equal(torch.get_rng_state(), state)
    again = exactness_report(RejectionSampler(), family, rows=3000, seed=4, batch_size=700)
    assert first == again
    assert "PASSED" in str(first) and first.rows == 3000


def _constant_verifier(value: int):
    def verifier(target_probs, bonus_token_ids, draft_probs, draft_token_ids):
        batch, k, _ = target_probs.shape
        return torch.full((batch, k + 1), value, dtype=torch.int64)

    return verifier


def test_harness_fails_malformed_outputs() -> None:
    family = make_family("random", 2, vocab=5, seed=1)
    report = exactness_report(_constant_verifier(-1), family, rows=500)
    assert report.malformed_rows == 500 and not report.passed()
    assert "malformed" in report.failures()[0]
    report = exactness_report(_constant_verifier(5), family, rows=500)
    assert report.malformed_rows == 500 and not report.passed()


def test_harness_fails_tokens_without_target_mass() -> None:
    """On one-hot targets every other token is impossible; emitting one fails outright."""
    family = make_family("onehot_target", 1, vocab=5, seed=1)
    wrong = int((family.target[0, family.start].argmax() + 1) % 5)

    def verifier(target_probs, bonus_token_ids, draft_probs, draft_token_ids):
        out = torch.full((target_probs.shape[0], 2), -1, dtype=torch.int64)
        out[:, 0] = wrong
        return out

    report = exactness_report(verifier, family, rows=200)
    assert report.positions[0].impossible == 200 and report.positions[0].p_value == 0.0
    assert not report.passed()
    assert "FAIL" in report.format()


def test_harness_rejects_wrong_output_shapes() -> None:
    def verifier(target_probs, bonus_token_ids, draft_probs, draft_token_ids):
        return draft_token_ids

    with pytest.raises(ValueError, match="shape"):
        exactness_report(verifier, make_family("random", 2), rows=10)


def test_statistics_without_scipy(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fallback chi-square and non-central tails agree with scipy's."""
    from specsample.testing import chi2_isf, chi2_sf, detectable_tv, ncx2_sf

    cases = [(3.84, 1), (12.0, 7), (100.0, 7), (300.0, 255), (0.01, 3), (80.0, 56)]
    with_scipy = [chi2_sf(x, df) for x, df in cases]
    nc_with_scipy = ncx2_sf(30.0, 7, 40.0)
    tv_with_scipy = detectable_tv(100_000, 7, 1e-4 / 6)
    monkeypatch.setitem(sys.modules, "scipy", None)
    monkeypatch.setitem(sys.modules, "scipy.stats", None)
    for (x, df), reference in zip(cases, with_scipy, strict=True):
        assert chi2_sf(x, df) == pytest.approx(reference, rel=1e-9, abs=1e-300)
    assert ncx2_sf(30.0, 7, 40.0) == pytest.approx(nc_with_scipy, rel=1e-9)
    assert chi2_isf(0.05, 1) == pytest.approx(3.841458820694124, rel=1e-9)
    assert detectable_tv(100_000, 7, 1e-4 / 6) == pytest.approx(tv_with_scipy, rel=1e-6)


def test_harness_imports_without_scipy() -> None:
    code = (
        "import sys; sys.modules['scipy'] = None; sys.modules['scipy.stats'] = None\n"
        "import specsample.testing as t\n"
        "assert abs(t.chi2_sf(3.841458820694124, 1) - 0.05) < 1e-12\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
