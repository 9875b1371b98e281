"""Top-k, top-p and min-p thresholds of one row of logits, without sorting it.

:func:`specsample.probs.row_norms` finds a row's thresholds on ``z`` (see
:mod:`specsample.probs`) by sorting: the whole row for top-p, the ``max_top_k`` largest for
top-k. :func:`filter_norms` finds the same thresholds by selection, in time linear in the
vocabulary:

* **top-k**: the ``k``-th largest logit, by :func:`kth_largest`, which reads only the blocks
  of the row whose largest logit reaches the ``k``-th largest of the blocks' maxima (the pass
  that finds the row's largest logit notes them), then its ``z``: ``z`` does not decrease as
  the logit grows, so the ``k``-th largest ``z`` is the ``z`` of the ``k``-th largest logit;
* **top-p**: the tokens kept by top-k, or with top-p alone those of the blocks with the
  largest maxima that hold enough mass, then a selection on their probability mass
  (:func:`top_p_cut`): partitions around pivots until the pivot at which the mass of larger
  ``z`` stays below ``top_p`` of the kept mass and the mass from it on reaches it, which is
  where PyTorch's sorted cumulative sum first reaches ``top_p``;
* **min-p**: ``log(min_p)``, taken as the caller computed it.

The masses are float32 exponentials summed in float64, as :mod:`specsample.probs` sums them,
but with :func:`~specsample.kernels.cpu.floats.exp32`, within one unit in the last place of the
exact exponential as PyTorch's is: the two sums differ by at most a relative ``2.4e-7``.
Where the mass on either side of the threshold lies within a relative :data:`MARGIN` of
``top_p``, the two could decide differently: :func:`filter_norms` reports the row as
undecided, and its caller takes that row's statistics from PyTorch. So the thresholds are
PyTorch's own, value for value, on every row.
"""

from __future__ import annotations

import numpy as np

from specsample.kernels.cpu.compiler import njit
from specsample.kernels.cpu.floats import BLOCK, exp32, scaled

MARGIN = 1e-6
"""Smallest distance, relative to the kept mass, between ``top_p`` and the masses on either
side of the selected threshold for the selection to stand (else PyTorch decides): twice the
largest difference two exponentials within one unit in the last place can make."""

_FIRST_BLOCKS = 64
"""Blocks of logits top-p alone reads first (then four times as many, until enough)."""


@njit
def _kth_of(values: np.ndarray, k: int) -> np.float32:
    """The ``k``-th largest of ``values`` (``1 <= k <= len(values)``)."""
    n = values.shape[0]
    return np.partition(values, n - k)[n - k]


@njit
def kth_largest(row: np.ndarray, maxima: np.ndarray, k: int, buffer: np.ndarray
                ) -> tuple[np.float32, int]:  # fmt: skip
    """The ``k``-th largest value of a float32 row without NaN, repeated values counted
    (``1 <= k <= len(row)``; ``-inf`` when fewer than ``k`` values exceed ``-inf``), and the
    number ``n`` of values it leaves in ``buffer`` (float32, as long as the row):
    ``buffer[:n]`` holds every value of the row at least the ``k``-th largest, and maybe
    smaller ones.

    ``maxima`` holds the largest value of each whole block of :data:`BLOCK` logits. The
    ``k``-th largest of those is a bar no higher than the answer (they are ``k`` values of
    the row); only blocks whose largest value reaches the bar are read.
    """
    bar = _kth_of(maxima, k) if maxima.shape[0] >= k else np.float32(-np.inf)
    n = 0
    for b in range(maxima.shape[0]):
        if maxima[b] >= bar:
            for i in range(b * BLOCK, (b + 1) * BLOCK):
                if row[i] >= bar:
                    buffer[n] = row[i]
                    n += 1
    for i in range(maxima.shape[0] * BLOCK, row.shape[0]):
        if row[i] >= bar:
            buffer[n] = row[i]
            n += 1
    return (_kth_of(buffer[:n], k) if n >= k else np.float32(-np.inf)), n


@njit
def gather_kept(row: np.ndarray, maxima: np.ndarray, shift: np.float32, scale: np.float32,
                cut: np.float32, out: np.ndarray) -> int:  # fmt: skip
    """Write the ``z`` of the row's tokens with ``-inf < z`` and ``z >= cut`` into ``out``
    (float32, as long as the row); return how many. ``z`` does not decrease as the logit
    grows, so a block whose largest logit (``maxima``, as :func:`kth_largest`) fails the test
    is skipped whole."""
    n = 0
    for b in range(maxima.shape[0] + 1):
        if b < maxima.shape[0]:
            best = scaled(maxima[b], shift, scale)
            if not (best >= cut and best > -np.inf):
                continue
        for i in range(b * BLOCK, min((b + 1) * BLOCK, row.shape[0])):
            z = scaled(row[i], shift, scale)
            if z >= cut and z > -np.inf:
                out[n] = z
                n += 1
    return n


@njit
def top_p_cut(z: np.ndarray, top_p: float, total: float) -> tuple[np.float32, bool]:
    """The top-p threshold among ``z`` (float32, each ``<= 0``, reordered in place), the
    largest kept values of a row whose kept mass is ``total`` (the float64 sum of the
    exponentials of all of them, those below ``z`` included): the largest ``t`` among ``z``
    with ``mass(z > t) < top_p * total <= mass(z >= t)``, and whether both inequalities hold
    by a relative :data:`MARGIN` of the total (the threshold is then PyTorch's; ``-inf`` and
    ``False`` when the mass of ``z`` never reaches it)."""
    wanted = top_p * total
    margin = MARGIN * total
    above = 0.0
    lo, hi = 0, z.shape[0]
    while lo < hi:
        a, b, c = z[lo], z[(lo + hi) // 2], z[hi - 1]
        pivot = max(min(a, b), min(max(a, b), c))
        greater, equal = 0.0, 0.0
        i, gt, lt = lo, lo, hi
        while i < lt:
            v = z[i]
            if v > pivot:
                z[i], z[gt] = z[gt], v
                greater += exp32(v)
                gt += 1
                i += 1
            elif v < pivot:
                lt -= 1
                z[i], z[lt] = z[lt], v
            else:
                equal += exp32(v)
                i += 1
        if above + greater >= wanted:
            hi = gt
        elif above + greater + equal >= wanted:
            decided = (
                above + greater <= wanted - margin and above + greater + equal >= wanted + margin
            )
            return pivot, decided
        else:
            above += greater + equal
            lo = lt
    return np.float32(-np.inf), False


@njit(fastmath={"reassoc"})
def _exp_sum(z: np.ndarray) -> float:
    """The float64 sum of ``exp(z)`` over float32 ``z`` (each ``<= 0``)."""
    total = 0.0
    for i in range(z.shape[0]):
        total += np.float64(exp32(z[i]))
    return total


@njit(fastmath={"reassoc"})
def _kept_mass(row: np.ndarray, shift: np.float32, scale: np.float32, cut: np.float32) -> float:
    """The float64 sum of ``exp(z)`` over a row's ``z >= cut`` (finite ``shift``), one
    vectorised pass."""
    total = 0.0
    for i in range(row.shape[0]):
        z = (row[i] - shift) * scale
        total += np.float64(exp32(z) if z >= cut else np.float32(0.0))
    return total


@njit
def _top_p_tokens(row: np.ndarray, maxima: np.ndarray, shift: np.float32, scale: np.float32,
                  top_p: float, total: float, out: np.ndarray) -> int:  # fmt: skip
    """Write into ``out`` the ``z`` of the tokens above a level whose mass surely reaches
    ``top_p`` of ``total`` (the tokens of the :data:`_FIRST_BLOCKS` blocks with the largest
    maxima, else four times as many, ..., else the whole row); return how many."""
    wanted = (top_p + MARGIN) * total
    blocks = _FIRST_BLOCKS
    while blocks < maxima.shape[0]:
        level = np.nextafter(scaled(_kth_of(maxima, blocks), shift, scale), np.float32(np.inf))
        n = gather_kept(row, maxima, shift, scale, level, out)
        if _exp_sum(out[:n]) >= wanted:
            return n
        blocks *= 4
    return gather_kept(row, maxima, shift, scale, np.float32(-np.inf), out)


@njit
def filter_norms(row: np.ndarray, maxima: np.ndarray, shift: np.float32, scale: np.float32,
                 top_k: int, top_p: np.float32, log_min_p: np.float32
                 ) -> tuple[np.float32, np.float32, bool]:  # fmt: skip
    """The cutoff and log-norm of a row with a distribution (no NaN, largest logit
    ``shift`` not ``-inf``) under its filters, as :func:`specsample.probs.row_norms` computes
    them: ``top_k`` (0 off), ``top_p`` (1 off), ``log_min_p`` (``-inf`` off). ``maxima``
    holds the largest logit of each whole block of :data:`BLOCK` (see :func:`kth_largest`).
    The third value says whether the cutoff is decided (see :func:`top_p_cut`); when it is
    not, the caller computes the row's statistics otherwise.

    With top-k, the tokens it keeps are the values :func:`kth_largest` leaves at or above
    the ``k``-th largest, unless a smaller logit rounds to the same ``z`` (then
    :func:`gather_kept` reads the row again). With top-p alone, one pass sums the kept mass,
    then the selection reads the blocks with the largest maxima, as many as it takes to hold
    ``top_p`` of the mass (:func:`_top_p_tokens`).
    """
    scratch = np.empty(row.shape[0], np.float32)
    if top_k > 0:
        kth, n = kth_largest(row, maxima, min(top_k, row.shape[0]), scratch)
        cut = scaled(kth, shift, scale)
        below = np.nextafter(kth, np.float32(-np.inf))
        if kth > -np.inf and scaled(below, shift, scale) >= cut:
            n = gather_kept(row, maxima, shift, scale, cut, scratch)
        else:
            n = _kept_z(scratch, n, kth, shift, scale)
        total = _exp_sum(scratch[:n]) if top_p < 1.0 else 0.0
    elif np.isfinite(shift) and top_p >= 1.0:
        cut = max(np.float32(-np.inf), log_min_p)
        return cut, np.log(np.float32(_kept_mass(row, shift, scale, cut))), True
    elif np.isfinite(shift):
        cut = np.float32(-np.inf)
        total = _kept_mass(row, shift, scale, cut)
        n = _top_p_tokens(row, maxima, shift, scale, top_p, total, scratch)
    else:
        cut = np.float32(-np.inf)
        n = gather_kept(row, maxima, shift, scale, cut, scratch)
        total = _exp_sum(scratch[:n]) if top_p < 1.0 else 0.0
    decided = True
    if top_p < 1.0:
        at_p, decided = top_p_cut(scratch[:n], top_p, total)
        cut = max(cut, at_p)
    cut = max(cut, log_min_p)
    kept = 0.0
    for i in range(n):
        if scratch[i] >= cut:
            kept += exp32(scratch[i])
    return cut, np.log(np.float32(kept)), decided


@njit(inline="always")
def _kept_z(values: np.ndarray, n: int, kth: np.float32, shift: np.float32, scale: np.float32
            ) -> int:  # fmt: skip
    """Replace ``values[:n]`` by the ``z`` above ``-inf`` of those at least ``kth``; return
    how many."""
    kept = 0
    for i in range(n):
        if values[i] >= kth:
            z = scaled(values[i], shift, scale)
            if z > -np.inf:
                values[kept] = z
                kept += 1
    return kept
