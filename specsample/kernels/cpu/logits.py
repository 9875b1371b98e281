"""The chain rule on flattened logits as one fused pass per sequence, and the row sums it needs.

:func:`row_norms` computes the :class:`specsample.probs.RowNorms` of rows from their largest
logits: one pass over each row with no filter, or none for a sampled row left to the walk.
:func:`chain_logits` then verifies a ragged batch as
:func:`specsample.backends.eager.verify_logits` does with ``method="chain"``: for each
sequence it walks its drafts until the first rejection, reading ``q(x)`` (and ``p(x)``) of
each draft alone (a row's largest logit and normaliser computed when the walk reaches it, so
a temperature-1 step reads only the rows it needs), then builds the target and draft rows at
that position once, in float32, and draws from their residual with
:func:`specsample.kernels.cpu.chain.draw_residual` (the hierarchy of
:mod:`specsample.rules.residual`). Threads take sequences as they free up, then compute the
rows of sequences still being walked ahead of the threads walking them, so one long walk is
shared by two cores (:mod:`specsample.kernels.cpu.atomics` keeps each row computed once); nothing
of size ``[batch, vocab]`` is allocated besides two rows per sequence being drawn.

Probabilities are ``exp(z - log_norm)`` with ``z`` as :func:`specsample.probs.scaled_logits`
computes it, in float32, with the exponential :func:`specsample.kernels.cpu.floats.exp32`, which
rounds differently from PyTorch's in about one value in ten, by one unit in the last place.
Rows with top-k, top-p or min-p filters get PyTorch's own thresholds, found by selection
(:mod:`specsample.kernels.cpu.filters`). So both backends draw the same tokens unless a uniform
falls within a relative ``1e-7`` of an accept threshold or a cell boundary, as with the
Triton backend's exponential.
"""

from __future__ import annotations

import numpy as np

from specsample.kernels.cpu import atomics
from specsample.kernels.cpu.chain import draw_residual
from specsample.kernels.cpu.compiler import njit, prange, serial
from specsample.kernels.cpu.filters import filter_norms
from specsample.kernels.cpu.floats import BLOCK, block_largest, exp32, prob, scaled


@njit(fastmath={"reassoc"})
def _exp_sum_into(row: np.ndarray, shift: np.float32, scale: np.float32, out: np.ndarray
                  ) -> np.float32:  # fmt: skip
    """``sum exp(z)`` of one row (float32, any order of additions), keeping each ``exp(z)``
    in ``out``: the one sum of every log-norm the kernels compute, so a row's log-norm does
    not depend on which kernel computed it."""
    total = np.float32(0.0)
    finite = np.isfinite(shift)  # then z = (value - shift) * scale exactly, as scaled() gives it
    for i in range(row.shape[0]):
        e = exp32((row[i] - shift) * scale if finite else scaled(row[i], shift, scale))
        out[i] = e
        total += e
    return total


@njit
def _largest(row: np.ndarray, maxima: np.ndarray) -> tuple[np.float32, int, bool]:
    """The largest value of a contiguous float32 row and the index of its first occurrence
    (``-inf`` and 0 for an empty row or one of ``-inf`` alone), and whether the row holds a
    NaN (the first two are then meaningless): one vectorised pass over blocks of the row,
    then the first occurrence sought in the first block holding the largest value. Where
    ``maxima`` is not empty, the largest value of each whole block goes into it."""
    bits = row.view(np.int32)
    size = row.shape[0]
    whole = size - size % BLOCK
    top, block, nan = np.float32(-np.inf), -1, False
    for start in range(0, whole, BLOCK):
        largest, block_nan = block_largest(bits, start)
        nan |= block_nan
        if maxima.shape[0]:
            maxima[start // BLOCK] = largest
        if largest > top:
            top, block = largest, start
    index = max(block, 0)
    while block >= 0 and row[index] != top:
        index += 1
    top = row[index] if block >= 0 else top
    for i in range(whole, size):
        nan |= np.isnan(row[i])
        if row[i] > top:
            top, index = row[i], i
    return top, index, nan


@njit(inline="always")
def _shift(row: np.ndarray, norms: np.ndarray, r: int, maxima: np.ndarray) -> int:
    """Set the shift (the largest logit) of row ``r``, its cutoff ``-inf`` and its log-norm
    NaN (not yet computed), or mark it without a distribution (shift 0, cutoff NaN, log-norm
    ``inf``) when it holds a NaN or only ``-inf``; return the index of its largest value (0
    without a distribution). ``maxima`` as :func:`_largest` takes it."""
    top, index, nan = _largest(row, maxima)
    if nan or np.isnan(top) or top == -np.inf:
        norms[0, r], norms[2, r], norms[3, r] = 0.0, np.nan, np.inf
        return 0
    norms[0, r], norms[2, r], norms[3, r] = top, -np.inf, np.nan
    return index


@njit(inline="always")
def _row_norms(logits: np.ndarray, norms: np.ndarray, argmax: np.ndarray, with_norm: bool,
               top_k: np.ndarray, limits: np.ndarray, lazy: np.ndarray, undecided: np.ndarray,
               r: int) -> None:  # fmt: skip
    """The statistics of row ``r`` (see :func:`row_norms`)."""
    row = logits[r]
    filtered = top_k.shape[0] and (top_k[r] > 0 or limits[0, r] < 1.0 or limits[1, r] > -np.inf)
    if lazy.shape[0] and lazy[r]:
        if not filtered:
            return
        lazy[r] = False
    maxima = np.empty(row.shape[0] // BLOCK if filtered else 0, np.float32)
    argmax[r] = _shift(row, norms, r, maxima)
    if np.isnan(norms[2, r]):
        return
    if filtered:
        norms[2, r], norms[3, r], decided = filter_norms(
            row, maxima, norms[0, r], norms[1, r], top_k[r], limits[0, r], limits[1, r]
        )
        undecided[r] = not decided
    elif with_norm:
        _log_norm(row, norms, r, np.empty(row.shape[0], np.float32))


@njit(inline="always")
def _fill_norm(logits: np.ndarray, norms: np.ndarray, argmax: np.ndarray, lazy: np.ndarray,
               r: int) -> None:  # fmt: skip
    """Compute the shift and argmax of row ``r`` if ``lazy`` marks it, then its log-norm where
    not computed (NaN on a row with a distribution: its cutoff is not NaN)."""
    if lazy.shape[0] and lazy[r]:
        argmax[r] = _shift(logits[r], norms, r, np.empty(0, np.float32))
    if np.isnan(norms[3, r]):
        _log_norm(logits[r], norms, r, np.empty(logits.shape[1], np.float32))


@njit(parallel=True)
def row_norms(
    logits: np.ndarray,
    norms: np.ndarray,
    argmax: np.ndarray,
    with_norm: bool,
    top_k: np.ndarray,
    limits: np.ndarray,
    lazy: np.ndarray,
    undecided: np.ndarray,
) -> None:
    """The :class:`specsample.probs.RowNorms` of ``[rows, vocab]`` float32 rows, rows in
    parallel, each read once from memory.

    ``norms[1]`` holds the rows' ``1 / T``; the kernel writes the shift (the row's largest
    logit), cutoff and log-norm into ``norms[0]``, ``norms[2]`` and ``norms[3]``, and the
    index of the first largest logit into ``argmax``, with the conventions of
    :func:`specsample.probs.row_norms` for a row without a distribution. Without ``with_norm``,
    the log-norms of rows with a distribution and no filter are left NaN. The rows that
    ``lazy`` ``[rows]`` (bool, or empty for none) marks are left to the step that reads them
    and not written at all, unless they have a filter (their mark is then cleared): on
    return, ``lazy`` marks the rows whose statistics :func:`chain_logits` and
    :func:`gumbel_logits <specsample.kernels.cpu.gumbel.gumbel_logits>` compute where their
    walk reads them (and :func:`fill_norms` all of them), so that a sampled row no walk
    reaches is never read.

    Filters: ``top_k`` ``[rows]`` int64 (0 off) and ``limits`` ``[2, rows]`` float32, the
    rows' ``top_p`` (1 off) and ``log(min_p)`` (``-inf`` off), or both empty when no row has
    a filter. A filtered row's cutoff and log-norm come from
    :func:`specsample.kernels.cpu.filters.filter_norms`; where its top-p threshold is too close to
    call, the kernel sets ``undecided`` ``[rows]`` (bool, False from the caller) at the row.
    """
    for r in prange(logits.shape[0]):
        _row_norms(logits, norms, argmax, with_norm, top_k, limits, lazy, undecided, r)


row_norms_serial = serial(row_norms)
"""The serial twin of :func:`row_norms`."""


@njit
def fill_norms(logits: np.ndarray, norms: np.ndarray, argmax: np.ndarray, lazy: np.ndarray
               ) -> None:  # fmt: skip
    """Complete the statistics of :func:`row_norms` (``norms`` ``[4, rows]``, ``argmax`` and
    ``lazy`` ``[rows]`` as there): the shift and argmax of the rows ``lazy`` marks, and
    every log-norm not computed."""
    for r in range(logits.shape[0]):
        _fill_norm(logits, norms, argmax, lazy, r)


@njit(inline="always")
def _fill_probs(row: np.ndarray, norms: np.ndarray, r: int, out: np.ndarray) -> None:
    """``out = q`` of logits ``row``, with ``norms[:, r]`` = (shift, scale, cut, log_norm)."""
    shift, scale, cut, log_norm = norms[0, r], norms[1, r], norms[2, r], norms[3, r]
    for i in range(row.shape[0]):
        out[i] = prob(row[i], shift, scale, cut, log_norm)


@njit(inline="always")
def _draft_norm(draft: np.ndarray, draft_norms: np.ndarray, row: int, known: int) -> int:
    """Compute the statistics of draft logits row ``row`` into ``draft_norms`` (whose
    ``[1]`` holds 1) unless it is ``known``, the row last computed; return ``row``."""
    if row != known:
        _shift(draft[row], draft_norms, row, np.empty(0, np.float32))
        _log_norm(draft[row], draft_norms, row, np.empty(draft.shape[1], np.float32))
    return row


@njit(inline="always")
def _draft_prob(draft: np.ndarray, draft_norms: np.ndarray, row: int, x: int) -> float:
    """``p(x)`` at a draft row: given probabilities, or from logits (their statistics
    computed, :func:`_draft_norm`); 1 for one-hot drafts."""
    if draft.shape[0] == 0:
        return 1.0
    if draft_norms.shape[1] == 0:
        return np.float64(draft[row, x])
    s = draft_norms
    return np.float64(prob(draft[row, x], s[0, row], s[1, row], s[2, row], s[3, row]))


@njit(inline="always")
def _draft_row(draft: np.ndarray, draft_norms: np.ndarray, row: int, x: int, rejected: bool,
               known: int, out: np.ndarray) -> None:  # fmt: skip
    """``out = p`` at the draw: the rejected draft's row (a one-hot row without draft rows,
    the draft ``x`` removed), or zeros where no draft applies (``q`` itself is drawn);
    ``known`` as :func:`_draft_norm` takes it."""
    out[:] = 0.0
    if not rejected:
        return
    if draft.shape[0] == 0:
        if 0 <= x < out.shape[0]:
            out[x] = 1.0
    elif draft_norms.shape[1] == 0:
        for i in range(out.shape[0]):
            out[i] = np.float32(draft[row, i])
    else:
        _draft_norm(draft, draft_norms, row, known)
        _fill_probs(draft[row], draft_norms, row, out)


_FREE, _TAKEN, _COMPUTED, _KNOWN = 0, 1, 2, 3
"""States of a target row's normaliser during :func:`chain_logits`: to compute, being
computed by a thread, computed by the kernel (with :func:`_exp_sum_into`, so that ``q`` of
the row is ``exp(z) / sum``), or not the kernel's to compute (given, or not needed)."""


@njit(inline="always")
def _row_states(lazy: np.ndarray, layout: np.ndarray, rows: int) -> np.ndarray:
    """``[rows]`` int64 states: :data:`_FREE` for the rows of sampled sequences that ``lazy``
    marks (their statistics left to the walk), :data:`_KNOWN` for every other row."""
    states = np.full(rows, _KNOWN, np.int64)
    if lazy.shape[0] == 0:
        return states
    for b in range(layout.shape[1]):
        for n in range(_rows_read(layout, b)):
            row = min(layout[2, b] + n, rows - 1)
            if lazy[row]:
                states[row] = _FREE
    return states


@njit(inline="always")
def _rows_read(layout: np.ndarray, b: int) -> int:
    """How many target rows sequence ``b`` may need the statistics of: none when greedy (its
    argmaxes are known), else one per draft and the bonus row unless its token is given."""
    if layout[3, b]:
        return 0
    return layout[0, b] + (1 if layout[4, b] < 0 else 0)


@njit(inline="always")
def _norm_into(target: np.ndarray, norms: np.ndarray, argmax: np.ndarray, row: int,
               out: np.ndarray) -> np.float32:  # fmt: skip
    """Set the shift, argmax and log-norm of target row ``row``, left to the walk, keeping
    each ``exp(z)`` in ``out``; return their sum (NaN for a row without a distribution,
    whose statistics :func:`_shift` sets)."""
    argmax[row] = _shift(target[row], norms, row, np.empty(0, np.float32))
    return _log_norm(target[row], norms, row, out)


@njit(inline="always")
def _log_norm(values: np.ndarray, norms: np.ndarray, r: int, out: np.ndarray) -> np.float32:
    """Set the log-norm of the row ``values`` at column ``r`` of ``norms`` (its shift set),
    keeping each ``exp(z)`` in ``out``; return their sum (NaN without a distribution)."""
    if np.isnan(norms[2, r]):
        return np.float32(np.nan)
    total = _exp_sum_into(values, norms[0, r], norms[1, r], out)
    norms[3, r] = np.log(total)
    return total


@njit(inline="always")
def _take(target: np.ndarray, norms: np.ndarray, argmax: np.ndarray, states: np.ndarray,
          row: int, out: np.ndarray) -> np.float32:  # fmt: skip
    """Compute the statistics of target row ``row`` if it is free (claimed first, published
    after): the sum of ``exp(z)``, each then in ``out``; NaN where another thread has it."""
    if atomics.read(states, row) != _FREE or not atomics.claim(states, row, _FREE, _TAKEN):
        return np.float32(np.nan)
    total = _norm_into(target, norms, argmax, row, out)
    atomics.publish(states, row, _COMPUTED)
    return total


_PATIENCE = 4
"""Reads of a row's state per logit of the row that a thread makes while another computes the
row, about the time the other needs for it, before computing it itself (the other is late:
not running, on a machine with more threads than cores)."""


@njit(inline="always")
def _settle(target: np.ndarray, norms: np.ndarray, argmax: np.ndarray, states: np.ndarray,
            row: int, out: np.ndarray, own: np.ndarray) -> np.float32:  # fmt: skip
    """Make the statistics of a sampled sequence's target row known, into ``own``
    (``[4, 1]``): computed here unless another thread has computed them, or is computing them
    (then wait for it, or compute them here without writing the shared ones if it is late).
    Returns the sum of ``exp(z)`` where computed here (each ``exp(z)`` then in ``out``), else
    NaN."""
    total = _take(target, norms, argmax, states, row, out)
    reads = 0
    while atomics.read(states, row) == _TAKEN:
        reads += 1
        if reads > _PATIENCE * target.shape[1]:
            own[1, 0] = norms[1, row]
            _shift(target[row], own, 0, np.empty(0, np.float32))
            return _log_norm(target[row], own, 0, out)
    own[:, 0] = norms[:, row]
    return total


@njit
def _help(target: np.ndarray, norms: np.ndarray, argmax: np.ndarray, layout: np.ndarray,
          states: np.ndarray, walked: np.ndarray) -> None:  # fmt: skip
    """Compute, ahead of the threads walking them, the statistics of rows of sampled
    sequences still being walked, for a thread left without a sequence of its own: every
    other row (the second, fourth...), so that the walking thread computes those between
    while this one computes the next (were it to take the next free row, it would finish
    each just before the walking thread could claim it, and take them all in turn)."""
    rows, vocab = target.shape
    scratch = np.empty(vocab, np.float32)
    for b in range(layout.shape[1]):
        n = 1
        while n < _rows_read(layout, b) and atomics.read(walked, b) == 0:
            row = min(layout[2, b] + n, rows - 1)
            _take(target, norms, argmax, states, row, scratch)
            n += 2


@njit
def _verify_one(target: np.ndarray, norms: np.ndarray, argmax: np.ndarray, layout: np.ndarray,
                ids: np.ndarray, draft: np.ndarray, draft_norms: np.ndarray,
                uniforms: np.ndarray, token_ids: np.ndarray,
                num_accepted: np.ndarray, states: np.ndarray, walked: np.ndarray, b: int
                ) -> None:  # fmt: skip
    """Verify sequence ``b`` (see :func:`chain_logits`)."""
    rows, vocab = target.shape
    final_column = uniforms.shape[1] - 1
    drafts, first, start, greedy = layout[0, b], layout[1, b], layout[2, b], layout[3, b]
    q_row = np.empty(0 if greedy else vocab, np.float32)
    exps, exps_total = -1, np.float32(1.0)  # the row whose exp(z) q_row holds, and its sum
    own = np.empty((4, 1), np.float32)  # the statistics of a sampled row being read
    d_known = -1  # the draft logits row whose statistics draft_norms holds
    n = 0
    while n < drafts:
        x, row = ids[first + n], min(start + n, rows - 1)
        if greedy:
            if x < 0 or x >= vocab or np.isnan(norms[2, row]) or x != argmax[row]:
                break
        else:
            total = _settle(target, norms, argmax, states, row, q_row, own)
            if not np.isnan(total):
                exps, exps_total = row, total
            if x < 0 or x >= vocab or np.isnan(own[2, 0]):
                break
            q = np.float64(prob(target[row, x], own[0, 0], own[1, 0], own[2, 0], own[3, 0]))
            if draft_norms.shape[1]:
                d_known = _draft_norm(draft, draft_norms, first + n, d_known)
            if not uniforms[b, n] * _draft_prob(draft, draft_norms, first + n, x) < q:
                break
        n += 1
    row = min(start + n, rows - 1)
    final = -1
    if layout[4, b] >= 0 and n == drafts:
        final = layout[4, b]
    elif greedy:
        final = argmax[row]
    else:
        total = _settle(target, norms, argmax, states, row, q_row, own)
        if not np.isnan(total):
            exps, exps_total = row, total
        computed = atomics.read(states, row) != _KNOWN  # by the kernel, with _exp_sum_into
        if exps != row and computed and not np.isnan(own[2, 0]):
            # by another thread: the same sum again, with each exp(z) kept here
            exps, exps_total = row, _exp_sum_into(target[row], own[0, 0], own[1, 0], q_row)
        if exps == row:  # q = exp(z) / sum, the sum its log-norm was taken of
            inverse = np.float32(1.0) / exps_total
            for i in range(vocab):
                q_row[i] *= inverse
        else:
            _fill_probs(target[row], own, 0, q_row)
        x = ids[first + n] if n < drafts else -1
        d_row = min(first + n, max(ids.shape[0] - 1, 0))
        u = uniforms[b, final_column]
        if n < drafts and draft.shape[0] and draft_norms.shape[1] == 0 and draft.itemsize == 4:
            final = draw_residual(q_row, draft[d_row], u)  # float32 probabilities, as given
        else:
            p_row = np.empty(vocab, np.float32)
            _draft_row(draft, draft_norms, d_row, x, n < drafts, d_known, p_row)
            final = draw_residual(q_row, p_row, u)
    atomics.publish(walked, b, 1)
    emit(token_ids, num_accepted, ids, b, first, n, final)


@njit
def emit(token_ids: np.ndarray, num_accepted: np.ndarray, ids: np.ndarray, b: int, first: int,
         n: int, final: int) -> None:  # fmt: skip
    """Write request ``b``'s output: its ``n`` accepted drafts (``ids`` from ``first``), then
    ``final``, in row ``b`` of ``token_ids`` (filled with -1 by the caller), and ``n``."""
    for j in range(n):
        token_ids[b, j] = ids[first + j]
    token_ids[b, n] = final
    num_accepted[b] = n


@njit(parallel=True)
def chain_logits(
    step: tuple,
    draft: np.ndarray,
    draft_norms: np.ndarray,
    uniforms: np.ndarray,
    token_ids: np.ndarray,
    num_accepted: np.ndarray,
    threads: int,
) -> None:
    """Verify a ragged batch on flattened logits into ``token_ids`` and ``num_accepted``.

    ``step`` holds the arrays every logits kernel reads first (see also
    :func:`specsample.kernels.cpu.gumbel.gumbel_logits`):

    - ``target``: ``[rows, vocab]`` float32 logits;
    - ``norms``: ``[4, rows]`` float32 shift, inverse temperature, cutoff and log-norm of each
      target row (the log-norm NaN where not yet computed, for a row with no filter);
    - ``argmax``: ``[rows]`` int64;
    - ``lazy``: ``[rows]`` bool, the rows of sampled sequences whose shift, argmax and
      log-norm are left to the walk, which computes those of the rows it reads (their values
      in ``norms`` and ``argmax`` are not read); empty for none;
    - ``layout``: ``[5, batch]`` int64 drafts, first draft row, first target row, greedy,
      and the given bonus token (or -1) of each sequence;
    - ``ids``: ``[total_drafts]`` int64 drafts.

    Then:

    - ``draft``: ``[total_drafts, vocab]`` probabilities, or logits with their
      ``draft_norms`` ``[4, total_drafts]`` (``[4, 0]`` with probabilities); ``[0, 0]`` for
      one-hot drafts;
    - ``uniforms``: ``[batch, max_drafts + 1]`` float64 (``[batch, 0]`` when every request is
      greedy): the accept tests, then the final draw (:func:`specsample.uniforms.step_uniforms`);
    - ``token_ids``: ``[batch, max_drafts + 1]`` int64, filled with -1 by the caller;
    - ``threads``: how many threads share the work
    (:func:`specsample.kernels.cpu.compiler.threads`).

    Each thread takes the next sequence not yet taken until none is left (so a thread whose
    sequences were short takes more of them), then computes the row statistics of sequences
    other threads are still walking, ahead of them (so one sequence's walk uses two cores).
    Which thread computes a row's statistics does not change them: the tokens do not depend
    on the threads.
    """
    target, norms, argmax, lazy, layout, ids = step
    batch = layout.shape[1]
    states = _row_states(lazy, layout, target.shape[0])
    walked = np.zeros(batch, np.int64)
    taken = np.zeros(1, np.int64)
    for _ in prange(min(threads, batch + 1)):  # a helper even for one sequence
        b = atomics.fetch_add(taken, 0, 1)
        while b < batch:
            _verify_one(target, norms, argmax, layout, ids, draft, draft_norms, uniforms,
                        token_ids, num_accepted, states, walked, b)  # fmt: skip
            b = atomics.fetch_add(taken, 0, 1)
        _help(target, norms, argmax, layout, states, walked)


chain_logits_serial = serial(chain_logits)
"""The serial twin of :func:`chain_logits`."""


def warm() -> None:
    """Compile the logits kernels for contiguous float32 logits, with each kind of draft
    rows (float32 or float64 probabilities, float32 logits, none), then freeze them."""
    logits = np.zeros((2, 4), np.float32)
    norms = np.zeros((4, 2), np.float32)
    argmax = np.zeros(2, np.int64)
    layout = np.array([[1], [0], [0], [0], [-1]], np.int64)
    fill_norms(logits, norms, argmax, np.ones(2, np.bool_))
    fill_norms.disable_compile()
    for norms_kernel in (row_norms, row_norms_serial):
        for top_k, limits in ((np.zeros(0, np.int64), np.zeros((2, 0), np.float32)),
                              (np.ones(2, np.int64), np.zeros((2, 2), np.float32))):  # fmt: skip
            norms_kernel(logits, norms, argmax, True, top_k, limits, np.zeros(0, np.bool_),
                         np.zeros(2, np.bool_))  # fmt: skip
        norms_kernel.disable_compile()
    for chain in (chain_logits, chain_logits_serial):
        for draft in (np.zeros((1, 4), np.float32), np.zeros((1, 4), np.float64)):
            step = (logits, norms, argmax, np.zeros(0, np.bool_), layout, np.zeros(1, np.int64))
            chain(
                step, draft, norms,
                np.full((1, 2), 0.5), np.zeros((1, 2), np.int64), np.zeros(1, np.int64), 2,
            )  # fmt: skip
        chain.disable_compile()
