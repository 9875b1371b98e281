"""Chi-square tests and tails: scipy when available, a self-contained implementation otherwise.

The exactness report runs one goodness-of-fit test per context of an output position;
:func:`chi2_sf`, :func:`ncx2_sf` and :func:`chi2_isf` are the central and non-central
chi-square tails it needs, and :func:`detectable_tv` turns them into the power of a test.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

MIN_EXPECTED = 5.0
"""Chi-square cells expected to hold fewer counts than this are merged (or dropped)."""


def _gamma_q(a: float, x: float) -> float:
    """Regularised upper incomplete gamma function ``Q(a, x)`` for ``a > 0``."""
    if x <= 0.0:
        return 1.0
    log_front = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        n = 0
        while abs(term) > abs(total) * 1e-16 and n < 100_000:
            n += 1
            term *= x / (a + n)
            total += term
        return max(0.0, 1.0 - total * math.exp(log_front))
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 100_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        step = d * c
        h *= step
        if abs(step - 1.0) < 1e-16:
            break
    return math.exp(log_front) * h


def chi2_sf(statistic: float, df: int) -> float:
    """Upper tail ``P(X >= statistic)`` of a chi-square variable with ``df`` degrees of freedom.

    Uses :func:`scipy.stats.chi2.sf` when scipy is installed and a regularised incomplete
    gamma function otherwise. ``df = 0`` (a point mass at 0) gives 1.

    Examples
    --------
    >>> round(chi2_sf(3.841458820694124, 1), 6)
    0.05
    """
    if df <= 0 or statistic <= 0.0:
        return 1.0
    if math.isinf(statistic):
        return 0.0
    try:
        from scipy.stats import chi2
    except ImportError:
        return _gamma_q(df / 2.0, statistic / 2.0)
    return float(chi2.sf(statistic, df))


def ncx2_sf(statistic: float, df: int, noncentrality: float) -> float:
    """Upper tail of a non-central chi-square variable (``df`` and ``noncentrality``).

    Uses :func:`scipy.stats.ncx2.sf` when scipy is installed, otherwise the Poisson mixture
    ``sum_i Pois(i; lambda / 2) Q(df / 2 + i, statistic / 2)``.

    Examples
    --------
    >>> round(ncx2_sf(10.0, 3, 0.0), 6) == round(chi2_sf(10.0, 3), 6)
    True
    """
    if noncentrality <= 0.0:
        return chi2_sf(statistic, df)
    try:
        from scipy.stats import ncx2
    except ImportError:
        pass
    else:
        return float(ncx2.sf(statistic, df, noncentrality))
    mu = noncentrality / 2.0
    last = int(mu + 12.0 * math.sqrt(mu) + 40.0)
    total = 0.0
    for i in range(last + 1):
        weight = math.exp(-mu + i * math.log(mu) - math.lgamma(i + 1.0))
        total += weight * _gamma_q(df / 2.0 + i, statistic / 2.0)
    return min(total, 1.0)


def _bisect(function: Callable[[float], float], low: float, high: float) -> float:
    """Root of an increasing function on ``[low, high]`` by bisection."""
    for _ in range(200):
        middle = 0.5 * (low + high)
        if function(middle) < 0.0:
            low = middle
        else:
            high = middle
        if high - low <= 1e-12 * max(1.0, high):
            break
    return 0.5 * (low + high)


def chi2_isf(alpha: float, df: int) -> float:
    """Critical value ``c`` with ``P(X >= c) = alpha`` for a chi-square variable.

    Raises
    ------
    ValueError
        ``alpha`` is not in ``(0, 1)``.

    Examples
    --------
    >>> round(chi2_isf(0.05, 1), 4)
    3.8415
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if df <= 0:
        return 0.0
    high = df + 10.0
    while chi2_sf(high, df) > alpha:
        high *= 2.0
    return _bisect(lambda x: alpha - chi2_sf(x, df), 0.0, high)


def detectable_tv(rows: int, df: int, alpha: float, power: float = 0.99) -> float:
    """Total-variation deviation a chi-square test detects with the given power, whatever its shape.

    A test at level ``alpha`` with ``df`` degrees of freedom on ``rows`` counts rejects with
    probability ``power`` once the non-centrality ``lambda = rows * D`` reaches the value
    ``lambda*`` solving ``P(ncx2(df, lambda*) >= c_alpha) = power``, where
    ``D = sum_x (o(x) - q(x))^2 / q(x)`` is the chi-square divergence of the tested law ``o``
    from the target ``q``. Cauchy-Schwarz gives ``D >= 4 TV^2`` for any deviation, so every
    deviation with ``TV >= sqrt(lambda* / (4 rows))`` is detected with at least that power.
    (With several contexts pooled, the same bound holds for the count-weighted mean TV.)
    This relies on the usual large-sample chi-square approximation, and deviations hidden
    inside merged cells are not seen.

    Parameters
    ----------
    rows : int
        Counts entering the test.
    df : int
        Degrees of freedom of the test (``>= 1``).
    alpha : float
        Level of the test (its false-failure rate).
    power : float
        Required probability of failing the deviation.

    Returns
    -------
    float
        The smallest total-variation distance detected with probability ``power``.

    Examples
    --------
    >>> round(detectable_tv(100_000, 7, 1e-4), 4)
    0.0116
    """
    if rows <= 0 or df <= 0:
        return math.inf
    critical = chi2_isf(alpha, df)
    high = 1.0
    while ncx2_sf(critical, df, high) < power:
        high *= 2.0
    noncentrality = _bisect(lambda lam: ncx2_sf(critical, df, lam) - power, 0.0, high)
    return math.sqrt(noncentrality / (4.0 * rows))


def pooled_cells(observed: torch.Tensor, expected: torch.Tensor) -> tuple[list[float], list[float]]:
    """Observed and expected counts of the cells tested, small cells pooled.

    Cells expected to hold fewer than :data:`MIN_EXPECTED` counts are pooled; a pool still
    too small is merged into the smallest remaining cell, or dropped when there is none.
    Zero-probability cells (``expected == 0``) are left out.
    """
    positive = expected > 0
    big = positive & (expected >= MIN_EXPECTED)
    small = positive & ~big
    cell_expected = expected[big].tolist()
    cell_observed = observed[big].to(torch.float64).tolist()
    if bool(small.any()):
        pool_expected = float(expected[small].sum())
        pool_observed = float(observed[small].sum())
        if pool_expected >= MIN_EXPECTED:
            cell_expected.append(pool_expected)
            cell_observed.append(pool_observed)
        elif cell_expected:
            smallest = min(range(len(cell_expected)), key=cell_expected.__getitem__)
            cell_expected[smallest] += pool_expected
            cell_observed[smallest] += pool_observed
    return cell_observed, cell_expected


def _context_test(observed: torch.Tensor, probs: torch.Tensor) -> tuple[float, int, int]:
    """Chi-square statistic, degrees of freedom and zero-probability hits of one context.

    Cells expected to hold fewer than :data:`MIN_EXPECTED` counts are pooled; a pool still
    too small is merged into the smallest remaining cell, or the context is dropped (no
    degrees of freedom) when no cell is large enough.

    Parameters
    ----------
    observed : torch.Tensor
        ``[vocab]`` int64 counts of the tokens emitted in this context.
    probs : torch.Tensor
        ``[vocab]`` float64 target row they should follow.

    Returns
    -------
    tuple of (float, int, int)
        The statistic, its degrees of freedom and the count of emitted tokens whose target
        probability is zero.

    Examples
    --------
    >>> statistic, df, impossible = _context_test(
    ...     torch.tensor([30, 70, 0]), torch.tensor([0.3, 0.7, 0.0], dtype=torch.float64))
    >>> round(statistic, 6), df, impossible
    (0.0, 1, 0)
    """
    count = float(observed.sum())
    impossible = int(observed[probs == 0].sum())
    cell_observed, cell_expected = pooled_cells(observed, probs * count)
    if len(cell_expected) < 2:
        return 0.0, 0, impossible
    statistic = sum((o - e) ** 2 / e for o, e in zip(cell_observed, cell_expected, strict=True))
    return statistic, len(cell_expected) - 1, impossible
