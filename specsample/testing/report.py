"""The exactness report: per-position chi-square tests and acceptance z-scores.

:func:`exactness_report` simulates a verifier on a toy pair, checks the layout of every
output row (:func:`well_formed`), tests the emitted tokens of each output position against
the target rows context by context, and compares the realised acceptance with its exact
value; :class:`ExactnessReport` holds the outcome and its verdict.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import NamedTuple

import torch

from specsample.testing.chisquare import _context_test, chi2_sf, detectable_tv
from specsample.testing.families import Family
from specsample.testing.simulation import Verifier, VerifierInputs, _run_blocks

_VARIANCE_FLOOR = 1e-12

_Z_TESTS = (("acceptance rate", "acceptance@0"), ("mean accepted", "mean accepted"))
"""Names of the two z-tests: in failure messages, then in the table."""


@dataclass(frozen=True)
class PositionResult:
    """The chi-square test of one output position.

    Attributes
    ----------
    position : int
        Output column ``n`` (``0 .. k``).
    emitted : int
        Rows in which position ``n`` was emitted.
    contexts : int
        Previous tokens that contributed at least one degree of freedom.
    statistic : float
        Chi-square statistic summed over contexts (``inf`` if a token with zero target
        probability was emitted).
    df : int
        Degrees of freedom summed over contexts.
    p_value : float
        Upper tail of ``statistic`` under the chi-square law with ``df`` degrees of freedom.
    tv : float
        Estimated total-variation distance between the emitted and target laws, averaged
        over contexts with weights the context counts. It is biased upwards by sampling
        noise (about ``sqrt(vocab / emitted)``); it is a size, not a test.
    impossible : int
        Emitted tokens whose target probability is zero.
    """

    position: int
    emitted: int
    contexts: int
    statistic: float
    df: int
    p_value: float
    tv: float
    impossible: int


@dataclass(frozen=True)
class ExactnessReport:
    """Outcome of :func:`exactness_report`.

    One chi-square test per output position and two z-tests of the acceptance;
    :meth:`passed` gives the verdict and ``str(report)`` the table.

    Attributes
    ----------
    family : str
        Name of the toy pair.
    k, vocab, rows : int
        Drafts per row, vocabulary size, simulated rows.
    positions : tuple of PositionResult
        One chi-square test per output position ``0 .. k``.
    acceptance_rate : float
        Realised acceptance rate of draft position 0.
    expected_acceptance_rate : float
        Its exact value ``sum_x min(q_0(x | start), p_0(x | start))``.
    acceptance_z : float
        ``(realised - expected) / sqrt(expected (1 - expected) / rows)``.
    mean_accepted : float
        Realised mean number of drafts accepted in order.
    expected_mean_accepted : float
        Its exact value.
    mean_accepted_z : float
        ``(realised - expected) / sqrt(exact variance / rows)``.
    malformed_rows : int
        Output rows that break the layout (accepted prefix equal to the drafts, one token in
        ``[0, vocab)``, then ``-1``); they are left out of the other statistics.
    """

    family: str
    k: int
    vocab: int
    rows: int
    positions: tuple[PositionResult, ...]
    acceptance_rate: float
    expected_acceptance_rate: float
    acceptance_z: float
    mean_accepted: float
    expected_mean_accepted: float
    mean_accepted_z: float
    malformed_rows: int

    @property
    def num_tests(self) -> int:
        """Tests the family-wise ``alpha`` is split over: one per position, plus two z-tests."""
        return len(self.positions) + 2

    def p_value_threshold(self, alpha: float) -> float:
        """Bonferroni level of each test: ``alpha / num_tests``."""
        return alpha / self.num_tests

    def z_threshold(self, alpha: float) -> float:
        """Largest ``|z|`` a two-sided z-test at level ``alpha / num_tests`` accepts."""
        return NormalDist().inv_cdf(1.0 - self.p_value_threshold(alpha) / 2.0)

    def _z_tests(self) -> tuple[tuple[float, float, float], ...]:
        """``(realised, exact, z)`` of the two z-tests, in the order of :data:`_Z_TESTS`."""
        return (
            (self.acceptance_rate, self.expected_acceptance_rate, self.acceptance_z),
            (self.mean_accepted, self.expected_mean_accepted, self.mean_accepted_z),
        )

    def failures(self, alpha: float = 1e-4) -> list[str]:
        """Human-readable reasons for failing at family-wise level ``alpha`` (empty: passed)."""
        level, z_max = self.p_value_threshold(alpha), self.z_threshold(alpha)
        reasons = []
        if self.malformed_rows:
            reasons.append(f"{self.malformed_rows} malformed output rows")
        for result in self.positions:
            if result.impossible:
                reasons.append(
                    f"position {result.position}: {result.impossible} tokens with zero target "
                    "probability"
                )
            elif result.p_value < level:
                reasons.append(
                    f"position {result.position}: p-value {result.p_value:.3g} < {level:.3g}"
                )
        for (label, _), (_, _, z) in zip(_Z_TESTS, self._z_tests(), strict=True):
            if not abs(z) < z_max:
                reasons.append(f"{label}: |z| = {abs(z):.3g} >= {z_max:.3g}")
        return reasons

    def passed(self, alpha: float = 1e-4) -> bool:
        """Whether every test passes at family-wise false-failure rate ``alpha`` (Bonferroni).

        Each chi-square p-value must be at least ``alpha / num_tests`` and each ``|z|`` below
        the two-sided normal quantile of the same level; no output row may be malformed and
        no emitted token may have zero target probability.
        """
        return not self.failures(alpha)

    def detectable_tv(self, position: int = 0, alpha: float = 1e-4, power: float = 0.99) -> float:
        """Total variation that the test of ``position`` detects with probability ``power``.

        See :func:`detectable_tv`; the test runs at the Bonferroni level ``alpha / num_tests``
        with the counts and degrees of freedom realised at that position.
        """
        result = self.positions[position]
        return detectable_tv(result.emitted, result.df, self.p_value_threshold(alpha), power)

    def format(self, alpha: float = 1e-4) -> str:
        """A table of every test, marking failures at family-wise level ``alpha``."""
        level, z_max = self.p_value_threshold(alpha), self.z_threshold(alpha)
        verdict = "PASSED" if self.passed(alpha) else "FAILED"
        lines = [
            f"exactness of family {self.family!r}: k={self.k} vocab={self.vocab} "
            f"rows={self.rows}: {verdict} at alpha={alpha:g} "
            f"(per test: p >= {level:.3g}, |z| < {z_max:.3g})",
            f"{'pos':>4} {'emitted':>9} {'ctx':>4} {'chi2':>11} {'df':>4} {'p-value':>10} "
            f"{'TV':>8} {'zero-q':>7}",
        ]
        for r in self.positions:
            flag = "" if r.p_value >= level and not r.impossible else "  <-- FAIL"
            lines.append(
                f"{r.position:>4} {r.emitted:>9} {r.contexts:>4} {r.statistic:>11.3f} {r.df:>4} "
                f"{r.p_value:>10.3g} {r.tv:>8.4f} {r.impossible:>7}{flag}"
            )
        for (_, label), (realised, expected, z) in zip(_Z_TESTS, self._z_tests(), strict=True):
            flag = "" if abs(z) < z_max else "  <-- FAIL"
            lines.append(f"{label:>13}: {realised:.5f} (exact {expected:.5f}, z = {z:+.2f}){flag}")
        lines.append(f"malformed rows: {self.malformed_rows}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def well_formed(token_ids: torch.Tensor, drafts: torch.Tensor, vocab: int) -> torch.Tensor:
    """Which output rows follow the layout: accepted drafts, one token in range, then ``-1``.

    Parameters
    ----------
    token_ids : torch.Tensor
        ``[rows, k + 1]`` integer output of a verifier.
    drafts : torch.Tensor
        ``[rows, k]`` integer drafted tokens it was given.
    vocab : int
        Vocabulary size.

    Returns
    -------
    torch.Tensor
        ``[rows]`` bool: the row starts with a (possibly empty) prefix of its drafts, then
        holds one token in ``[0, vocab)``, then only ``-1``.

    Examples
    --------
    >>> drafts = torch.tensor([[3, 1], [3, 1], [3, 1]])
    >>> well_formed(torch.tensor([[3, 0, -1], [2, 1, 0], [-1, -1, -1]]), drafts, vocab=4)
    tensor([ True, False, False])
    """
    k = drafts.shape[1]
    length = (token_ids != -1).sum(dim=1)
    cols = torch.arange(k + 1)
    body = cols < length.unsqueeze(-1)
    in_vocab = (token_ids >= 0) & (token_ids < vocab)
    ok = (length >= 1) & torch.where(body, in_vocab, token_ids == -1).all(dim=1)
    accepted = cols[:k] < (length - 1).unsqueeze(-1)
    return ok & (~accepted | (token_ids[:, :k] == drafts)).all(dim=1)


def _transition_counts(token_ids: torch.Tensor, family: Family) -> torch.Tensor:
    """Token counts by output position and previous token, ``[k + 1, vocab, vocab]`` int64.

    Entry ``[n, t, x]`` counts the rows of the ``[rows, k + 1]`` well-formed output
    ``token_ids`` that emit ``x`` at position ``n`` after ``t`` (the start token for
    ``n = 0``).
    """
    k, vocab = family.k, family.vocab
    length = (token_ids != -1).sum(dim=1)
    counts = torch.zeros((k + 1) * vocab * vocab, dtype=torch.int64)
    for n in range(k + 1):
        emitted = length > n
        if n == 0:
            prev = torch.full((int(emitted.sum()),), family.start, dtype=torch.int64)
        else:
            prev = token_ids[emitted, n - 1]
        index = (n * vocab + prev) * vocab + token_ids[emitted, n]
        counts += torch.bincount(index, minlength=counts.numel())
    return counts.view(k + 1, vocab, vocab)


def _position_result(
    position: int, counts: torch.Tensor, reference: torch.Tensor
) -> PositionResult:
    """Chi-square test of one output position, summed over its contexts.

    ``counts[t, x]`` (``[vocab, vocab]`` int64) counts the tokens ``x`` emitted after ``t``;
    ``reference[t]`` (``[vocab, vocab]`` float64) is the target row they should follow.
    """
    statistic, df, impossible, contexts, weighted_tv = 0.0, 0, 0, 0, 0.0
    for context in range(counts.shape[0]):
        observed = counts[context]
        count = int(observed.sum())
        if count == 0:
            continue
        s, d, z = _context_test(observed, reference[context])
        statistic, df, impossible = statistic + s, df + d, impossible + z
        contexts += d > 0
        deviation = observed.to(torch.float64) / count - reference[context]
        tv = 0.5 * float(deviation.abs().sum())
        weighted_tv += count * tv
    emitted = int(counts.sum())
    return PositionResult(
        position=position,
        emitted=emitted,
        contexts=contexts,
        statistic=math.inf if impossible else statistic,
        df=df,
        p_value=0.0 if impossible else chi2_sf(statistic, df),
        tv=weighted_tv / emitted if emitted else 0.0,
        impossible=impossible,
    )


def _z_score(realised: float, expected: float, variance: float, count: int) -> float:
    if count == 0:
        return 0.0
    scale = math.sqrt(max(variance, _VARIANCE_FLOOR) / count)
    return (realised - expected) / scale


class _Acceptance(NamedTuple):
    """Realised and exact acceptance of draft position 0 and mean accepted, with z-scores."""

    rate: float
    expected_rate: float
    rate_z: float
    mean: float
    expected_mean: float
    mean_z: float


def _acceptance(lengths: torch.Tensor, law: torch.Tensor) -> _Acceptance:
    """Compare the accepted lengths (``[k + 1]`` int64 counts) with their exact law.

    ``law`` is ``[k + 1]`` float64, from :meth:`Family.accepted_length_law`.
    """
    good = int(lengths.sum())
    counts = lengths.to(torch.float64)
    accepted = torch.arange(law.shape[0], dtype=torch.float64)
    expected_rate = min(max(float(law[1:].sum()), 0.0), 1.0)
    rate = float(counts[1:].sum()) / good if good else math.nan
    expected_mean = float((law * accepted).sum())
    variance = max(float((law * accepted * accepted).sum()) - expected_mean * expected_mean, 0.0)
    mean = float((counts * accepted).sum()) / good if good else math.nan
    return _Acceptance(
        rate=rate,
        expected_rate=expected_rate,
        rate_z=_z_score(rate, expected_rate, expected_rate * (1.0 - expected_rate), good),
        mean=mean,
        expected_mean=expected_mean,
        mean_z=_z_score(mean, expected_mean, variance, good),
    )


class _Tally:
    """What :func:`exactness_report` keeps of each block of output rows."""

    def __init__(self, family: Family) -> None:
        self.family = family
        self.counts = torch.zeros(family.k + 1, family.vocab, family.vocab, dtype=torch.int64)
        self.lengths = torch.zeros(family.k + 1, dtype=torch.int64)
        self.malformed = 0

    def __call__(self, inputs: VerifierInputs, token_ids: torch.Tensor) -> None:
        family = self.family
        ok = well_formed(token_ids, inputs.draft_token_ids, family.vocab)
        good = token_ids[ok]
        self.malformed += token_ids.shape[0] - good.shape[0]
        self.counts += _transition_counts(good, family)
        accepted = (good != -1).sum(dim=1) - 1
        self.lengths += torch.bincount(accepted, minlength=family.k + 1)


def exactness_report(
    verifier: Verifier,
    family: Family,
    rows: int = 100_000,
    seed: int = 0,
    *,
    batch_size: int = 8192,
    device: torch.device | str = "cpu",
    rule: str = "chain",
) -> ExactnessReport:
    """Test ``verifier`` for exactness on ``rows`` sequences drafted from ``family``.

    For each output position ``n`` and each previous emitted token ``t`` (the start token
    for ``n = 0``), the tokens emitted at ``n`` are compared with ``q_n(. | t)`` by a
    chi-square test (cells with expected count below :data:`MIN_EXPECTED` merged); statistics
    and degrees of freedom are summed over the contexts of a position, giving one p-value
    per position. The realised acceptance rate of draft position 0 and the mean number of
    accepted drafts are compared with their exact values by z-scores. See the package
    documentation for why conditioning on the previous token is the right criterion.

    Parameters
    ----------
    verifier : Verifier
        ``verifier(target_probs [b, k, vocab], bonus_token_ids [b, 1], draft_probs
        [b, k, vocab], draft_token_ids [b, k]) -> [b, k + 1]`` int64, ``-1`` padded.
    family : Family
        The toy pair (see :func:`make_family`).
    rows : int
        Sequences simulated. They are drafted, verified and counted a block at a time
        (see :data:`specsample.testing.DRAW_BLOCK_VALUES`), so memory does not grow with ``rows``.
    seed : int
        Seeds the drafts and the verifier's randomness (the same as :func:`simulate`).
    batch_size : int
        Most rows per verifier call.
    device : torch.device or str
        Where the verifier runs.
    rule : str
        The rule whose exact acceptance the realised one is compared with: ``"chain"``
        (token by token) or ``"block"`` (see :meth:`Family.accepted_length_law`). The
        distribution tests do not depend on it.

    Returns
    -------
    ExactnessReport
        Use :meth:`ExactnessReport.passed` for a verdict and ``str(report)`` for a table.

    Raises
    ------
    TypeError
        ``rows`` or ``batch_size`` is not an int.
    ValueError
        ``rows`` is negative, ``batch_size`` below 1, ``rule`` unknown (or ``"block"`` on a
        family too large to enumerate), or the verifier returned a tensor of the wrong
        shape or dtype.

    Examples
    --------
    >>> from specsample.sampler import RejectionSampler
    >>> from specsample.testing import make_family
    >>> report = exactness_report(RejectionSampler(), make_family("peaked", k=1),
    ...                           rows=2000, seed=3)
    >>> report.passed(), len(report.positions), report.num_tests
    (True, 2, 4)
    """
    law = family.accepted_length_law(rule)
    tally = _Tally(family)
    _run_blocks(verifier, family, rows, tally, seed=seed, batch_size=batch_size, device=device)
    counts = tally.counts
    reference = family.reference()
    acceptance = _acceptance(tally.lengths, law)
    return ExactnessReport(
        family=family.name,
        k=family.k,
        vocab=family.vocab,
        rows=rows,
        positions=tuple(_position_result(n, counts[n], reference[n]) for n in range(family.k + 1)),
        acceptance_rate=acceptance.rate,
        expected_acceptance_rate=acceptance.expected_rate,
        acceptance_z=acceptance.rate_z,
        mean_accepted=acceptance.mean,
        expected_mean_accepted=acceptance.expected_mean,
        mean_accepted_z=acceptance.mean_z,
        malformed_rows=tally.malformed,
    )
