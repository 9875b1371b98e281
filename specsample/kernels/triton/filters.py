"""The thresholds of top-k, top-p and min-p by a Triton kernel, and the Triton backend's norms.

:func:`filtered_norms` computes what :func:`specsample.probs.row_norms` computes for rows
with filters: after the one pass of :func:`~specsample.kernels.triton.norms.logit_norms`
(argmax, largest logit, NaN), a second kernel finds each row's ``cutoff`` on ``z = (logit -
shift) * inv_temperature`` and the log-sum-exp of the kept ``z``:

* **min-p** needs no search: its threshold ``log(min_p)`` (taken on the host, as
  :func:`specsample.probs.row_norms` takes it) is known once the largest logit is, so a
  row with min-p alone is read twice in all;
* **top-k** keeps ``z >= t`` for the largest value ``t`` of the row with at least ``k`` of
  its ``z`` at or above it (``k`` capped at the vocabulary): the ``k``-th largest ``z``;
* **top-p** keeps, of the ``z`` top-k kept, those ``>= t`` for the largest value ``t``
  whose mass ``sum(exp(z) for z >= t)`` (float32 exponentials summed in float64) reaches
  ``top_p`` of the kept mass: the threshold of :func:`specsample.probs.row_norms`, which
  finds it by sorting.

Both thresholds are values of the row, found by one search over passes: a bracket ``[lo,
hi]`` of values holds the threshold (``lo`` satisfies the condition, every value above
``hi`` fails it); each pass reads the row once and measures, at :data:`PIVOTS` pivots spread
evenly between ``lo`` and ``hi`` in the order of float32 bit patterns, the count and mass at
or above each pivot and the row's nearest values above and below it. The last pivot that
satisfies the condition and the first that fails it give the next bracket, snapped to values
of the row, so every pass divides the bracket's span of bit patterns by at least
:data:`PIVOTS` (at most 11 passes for 8 pivots) and usually ends it sooner. The count is
exact and the masses are float64 sums of float32 exponentials, as PyTorch's, so the cutoff
is :func:`~specsample.probs.row_norms`'s, except where a top-p mass lies within the
exponentials' rounding (a relative ``1e-7``) of ``top_p`` of the total and the two
exponential functions disagree; the log-norm, one last pass over the kept ``z``, agrees to
float32 rounding. Nothing reads a device tensor on the host and nothing synchronises: each program
runs its rows' searches to their end.

:func:`row_norms` is the Triton backend's statistics of a plan
(:func:`specsample.backends.eager.row_norms`, same arguments and results): one pass for a
batch without filters, this kernel after it for a batch where a request may have one.

The module is imported twice, as :mod:`specsample.kernels.triton.norms` is: as the host
side, which never imports triton, and, on the first launch in a mode, as that mode's kernel
module (see :func:`specsample.kernels.triton.launch.mode_kernel`).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from specsample.kernels.triton.launch import (
    MODE_PACKAGES,
    _check_device,
    _next_power_of_two,
    interpreting,
    mode_kernel,
)
from specsample.kernels.triton.norms import logit_norms
from specsample.params.metadata import SamplingMetadata
from specsample.probs import RowNorms
from specsample.rules.rows import unit_columns

PIVOTS = 8
"""Pivots a compiled program measures per pass of a search (a power of two); read at each
launch."""

INTERPRETER_PIVOTS = 4
"""Pivots per pass under the interpreter (tests lower it to 2 to run longer searches); read
at each launch."""

COLUMNS = 1024
"""Vocabulary columns a compiled program reads at a time; read at each launch."""

INTERPRETER_COLUMNS = 256
"""Columns a program reads at a time under the interpreter; read at each launch."""

_INTERPRETER_ELEMENTS = 1 << 18

_KERNEL_COPY = (__package__ or "").rpartition(".")[2] in MODE_PACKAGES.values()
"""Whether this copy is a mode's kernel module (see :func:`_kernel`), not the host side."""


def _kernel() -> Any:
    """The filter kernel for the current mode (compiled or interpreted), loaded once."""
    return mode_kernel(__name__.rpartition(".")[2], "_filter_kernel")


def filtered(sampling: SamplingMetadata) -> bool:
    """Whether some request may have a top-k, top-p or min-p filter (known on the host).

    Examples
    --------
    >>> import torch
    >>> cpu = torch.device("cpu")
    >>> filtered(SamplingMetadata.build(2, cpu, top_p=0.9))
    True
    >>> filtered(SamplingMetadata.build(2, cpu, temperature=0.0, top_k=5))
    False
    """
    return _top_k(sampling) is not None or sampling.top_p is not None or sampling.min_p is not None


def _top_k(sampling: SamplingMetadata) -> torch.Tensor | None:
    """The ``[rows]`` top-k of ``sampling``, or ``None`` when no request may have one."""
    return sampling.top_k if sampling.top_k is not None and sampling.max_top_k != 0 else None


def filtered_norms(logits: torch.Tensor, sampling: SamplingMetadata) -> RowNorms:
    """:func:`specsample.probs.sampling_norms` of ``[rows, vocab]`` logits, by the kernels.

    Parameters
    ----------
    logits : torch.Tensor
        ``[rows, vocab]`` float32, float16, bfloat16 or float64 (a row stride is kept).
    sampling : SamplingMetadata
        One set of parameters per row (``[rows]`` tensors on the logits' device).

    Returns
    -------
    RowNorms
        ``[rows]`` each: argmax, shift and cutoff as :func:`~specsample.probs.sampling_norms`
        gives them, ``log_norm`` to float32 rounding.

    Raises
    ------
    TypeError, ValueError, RuntimeError
        As :func:`specsample.kernels.triton.norms.logit_norms`.

    Examples
    --------
    >>> import torch
    >>> from specsample.kernels import triton as kernels
    >>> from specsample.probs import sampling_norms
    >>> meta = SamplingMetadata.build(2, torch.device("cpu"), top_k=[2, 0], top_p=[1.0, 0.5])
    >>> logits = torch.tensor([[1.0, 3.0, 2.0, 0.0], [0.0, 4.0, 1.0, 3.9]])
    >>> compute = filtered_norms if kernels.supports(logits) else sampling_norms
    >>> compute(logits, meta).cutoff.tolist()
    [-1.0, 0.0]
    """
    norms = logit_norms(logits, sampling.inv_temperature, need_norm=True)
    rows, vocab = logits.shape
    if rows == 0:
        return norms
    top_k, top_p, min_p = _top_k(sampling), sampling.top_p, sampling.min_p
    _check_device(logits, top_k, top_p, min_p)
    logits = unit_columns(logits)
    interpreted = interpreting() or logits.device.type != "cuda"
    cols = min(INTERPRETER_COLUMNS if interpreted else COLUMNS, _next_power_of_two(vocab))
    pivots = INTERPRETER_PIVOTS if interpreted else PIVOTS
    per_program = 1
    if interpreted:
        per_program = max(
            1, min(_next_power_of_two(rows), _INTERPRETER_ELEMENTS // (cols * pivots))
        )
    min_cut = None if min_p is None else torch.where(min_p > 0.0, torch.log(min_p), -math.inf)
    _kernel()[(-(-rows // per_program),)](
        logits,
        logits.stride(0),
        norms.inv_temperature,
        norms.shift,
        norms.cutoff,
        norms.log_norm,
        logits if top_k is None else top_k.contiguous(),
        logits if top_p is None else top_p.contiguous(),
        logits if min_cut is None else min_cut,
        rows,
        vocab,
        -(-vocab // cols),
        R=per_program,
        COLS=cols,
        P=pivots,
        HAS_K=top_k is not None,
        HAS_P=top_p is not None,
        HAS_MIN=min_cut is not None,
        num_warps=4,
        enable_fp_fusion=False,
    )
    return norms


def row_norms(
    logits: torch.Tensor, sampling: SamplingMetadata, *, need_norm: bool = False
) -> RowNorms:
    """The statistics of ``[rows, vocab]`` logits, each row processed with its parameters in
    ``sampling``: :func:`specsample.backends.eager.row_norms` by the kernels.

    The normalisers of every row are computed when a request samples or with
    ``need_norm``, else the argmaxes alone (any filter then plays no part), in one pass
    (:func:`~specsample.kernels.triton.norms.logit_norms`); a batch where some request may
    have a top-k, top-p or min-p filter then has its thresholds found
    (:func:`filtered_norms`).

    Parameters
    ----------
    logits : torch.Tensor
        ``[rows, vocab]`` float32, float16, bfloat16 or float64.
    sampling : SamplingMetadata
        One set of parameters per row (``[rows]`` tensors).
    need_norm : bool
        Compute the normalisers even when every row is greedy.

    Returns
    -------
    RowNorms
        ``[rows]`` each, as :func:`specsample.probs.sampling_norms` gives them (``log_norm``
        to float32 rounding).

    Examples
    --------
    >>> import torch
    >>> from specsample.kernels import triton as kernels
    >>> from specsample.backends import eager
    >>> meta = SamplingMetadata.build(2, torch.device("cpu"), temperature=[0.0, 0.5])
    >>> logits = torch.tensor([[1.0, 3.0, 2.0], [4.0, 0.0, 4.0]])
    >>> compute = row_norms if kernels.supports(logits) else eager.row_norms
    >>> s = compute(logits, meta)
    >>> s.argmax.tolist(), s.shift.tolist(), round(float(s.log_norm[1]), 4)
    ([1, 0], [3.0, 4.0], 0.6933)
    """
    norm = need_norm or not sampling.all_greedy
    if norm and filtered(sampling):
        return filtered_norms(logits, sampling)
    return logit_norms(logits, sampling.inv_temperature, need_norm=norm)


if _KERNEL_COPY:
    import triton
    import triton.language as tl

    from ._common import _bound, _exp, _log
    from .norms import _gap

    @triton.jit
    def _key(x):
        """The float32 ``x`` as an int32 whose order is the floats' order (``-inf`` lowest)."""
        bits = x.to(tl.int32, bitcast=True)
        return tl.where(bits < 0, bits ^ 0x7FFFFFFF, bits)

    @triton.jit
    def _value(key):
        """The float32 whose :func:`_key` is ``key`` (int32)."""
        return tl.where(key < 0, key ^ 0x7FFFFFFF, key).to(tl.float32, bitcast=True)

    @triton.jit
    def _z(row, live, top, inv, block, vocab, COLS: tl.constexpr):
        """``z`` of block ``block`` of the rows at pointers ``row [R]`` (``+0.0`` for the
        largest logit), and which of the block's columns are in the rows, each ``[R, COLS]``."""
        at = block * COLS + tl.arange(0, COLS).to(tl.int64)
        mask = live[:, None] & (at[None, :] < vocab)
        x = tl.load(row[:, None] + at[None, :], mask=mask, other=float("-inf")).to(tl.float32)
        return _gap(x, top[:, None]) * inv[:, None] + 0.0, mask

    @triton.jit
    def _measure(row, live, top, inv, floor, pivots, n_blocks, vocab, COLS: tl.constexpr):
        """One pass over the rows' ``z >= floor``: at each of ``pivots [R, P]``, the count
        and float64 mass of the ``z`` at or above it, the smallest such ``z`` and the largest
        ``z`` below it; and the mass of all of them."""
        count = tl.zeros(pivots.shape, tl.int32)
        mass = tl.zeros(pivots.shape, tl.float64)
        above = tl.full(pivots.shape, float("inf"), tl.float32)
        below = tl.full(pivots.shape, float("-inf"), tl.float32)
        total = tl.zeros(top.shape, tl.float64)
        for block in range(0, _bound(n_blocks)):
            z, mask = _z(row, live, top, inv, block, vocab, COLS)
            kept = mask & (z >= floor[:, None])
            e = tl.where(kept, _exp(z), 0.0).to(tl.float64)
            total += tl.sum(e, axis=1)
            at = kept[:, :, None] & (z[:, :, None] >= pivots[:, None, :])
            under = kept[:, :, None] & (z[:, :, None] < pivots[:, None, :])
            count += tl.sum(at.to(tl.int32), axis=1)
            mass += tl.sum(tl.where(at, e[:, :, None], 0.0), axis=1)
            above = tl.minimum(above, tl.min(tl.where(at, z[:, :, None], float("inf")), axis=1))
            below = tl.maximum(below, tl.max(tl.where(under, z[:, :, None], float("-inf")), axis=1))
        return count, mass, above, below, total

    @triton.jit
    def _search(row, active, top, inv, floor, need, n_blocks, vocab,
                COLS: tl.constexpr, P: tl.constexpr, MASS: tl.constexpr):  # fmt: skip
        """The largest value ``t`` of each active row (among its ``z >= floor``) with at
        least ``need`` (int64 ``k``) of them at or above it, or, with ``MASS``, whose mass at
        or above it reaches ``need`` (``top_p``) of theirs; ``-inf`` for inactive rows.

        ``lo`` and ``hi`` are keys (:func:`_key`) of values of the row bracketing the
        threshold: ``lo`` satisfies the condition (at first ``floor``, which every row does)
        and the threshold is at most ``hi`` (at first 0, the largest ``z``)."""
        j = tl.arange(0, P)
        lo = _key(floor)
        hi = _key(tl.zeros(floor.shape, tl.float32))
        todo = active & (lo < hi)
        while tl.max(todo.to(tl.int32), axis=0) > 0:
            span = (hi - lo).to(tl.int64)
            keys = lo.to(tl.int64)[:, None] + span[:, None] * (j[None, :] + 1) // P
            pivots = _value(keys.to(tl.int32))
            count, mass, above, below, total = _measure(
                row, todo, top, inv, floor, pivots, n_blocks, vocab, COLS
            )
            if MASS:
                enough = mass >= need.to(tl.float64)[:, None] * total[:, None]
            else:
                enough = count.to(tl.int64) >= need[:, None]
            passing = tl.sum(enough.to(tl.int32), axis=1)
            last = tl.max(tl.where(j[None, :] == passing[:, None] - 1, above, float("-inf")), 1)
            first = tl.max(tl.where(j[None, :] == passing[:, None], below, float("-inf")), 1)
            new_lo = tl.where(passing > 0, _key(last), lo)
            new_hi = tl.where(passing < P, _key(first), new_lo)
            lo = tl.where(todo, new_lo, lo)
            hi = tl.where(todo, new_hi, hi)
            todo = todo & (lo < hi)
        return tl.where(active, _value(lo), float("-inf"))

    @triton.jit
    def _kept_sum(row, live, top, inv, cut, n_blocks, vocab, COLS: tl.constexpr):
        """``sum(exp(z) for z >= cut)`` of each row, in float32."""
        lanes = tl.zeros([top.shape[0], COLS], tl.float32)
        for block in range(0, _bound(n_blocks)):
            z, mask = _z(row, live, top, inv, block, vocab, COLS)
            lanes += tl.where(mask & (z >= cut[:, None]), _exp(z), 0.0)
        return tl.sum(lanes, axis=1)

    @triton.jit(do_not_specialize=("rows_total", "n_blocks"))
    def _filter_kernel(
        logits, stride, inv_t, shift, cutoff, log_norm, top_k, top_p, min_cut,
        rows_total, vocab, n_blocks,
        R: tl.constexpr, COLS: tl.constexpr, P: tl.constexpr,
        HAS_K: tl.constexpr, HAS_P: tl.constexpr, HAS_MIN: tl.constexpr,
    ):  # fmt: skip
        """The cutoffs and log-norms of ``R`` rows whose one-pass norms are in place."""
        rows = (tl.program_id(0) * R + tl.arange(0, R)).to(tl.int64)
        live = rows < rows_total
        usable = live & (tl.load(cutoff + rows, mask=live, other=0.0) == float("-inf"))
        inv = tl.load(inv_t + rows, mask=live, other=1.0)
        top = tl.load(shift + rows, mask=live, other=0.0)
        row = logits + rows * stride
        cut = tl.full([R], float("-inf"), tl.float32)
        if HAS_K:
            k = tl.minimum(tl.load(top_k + rows, mask=live, other=0), vocab)
            cut = _search(row, usable & (k > 0), top, inv, cut, k, n_blocks, vocab,
                          COLS, P, False)  # fmt: skip
        if HAS_P:
            p = tl.load(top_p + rows, mask=live, other=1.0)
            cut_p = _search(row, usable & (p < 1.0), top, inv, cut, p, n_blocks, vocab,
                            COLS, P, True)  # fmt: skip
            cut = tl.maximum(cut, cut_p)
        if HAS_MIN:
            cut = tl.maximum(cut, tl.load(min_cut + rows, mask=live, other=float("-inf")))
        cut = tl.where(usable, cut, float("-inf"))
        final = usable & (cut > float("-inf"))
        total = _kept_sum(row, final, top, inv, cut, n_blocks, vocab, COLS)
        tl.store(cutoff + rows, cut, mask=final)
        tl.store(log_norm + rows, _log(tl.where(final, total, 1.0)), mask=final)
