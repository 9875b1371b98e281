"""Row statistics of logits by a Triton kernel: :class:`~specsample.probs.RowNorms` in one pass.

:func:`logit_norms` computes what :func:`specsample.probs.row_norms` computes for rows
processed with a temperature alone (no top-k, top-p or min-p), reading each row once: a
program walks its row's vocabulary block by block, and each of the block's columns (a
*lane*) keeps, over the logits it sees,

* its largest logit and the first index that holds it (a logit replaces them only when
  larger), compared in the logits' own precision widened exactly (float32; float64 for
  float64 logits);
* whether it saw a NaN (the row then has no distribution, whatever its other values);
* with ``need_norm``, the sum of ``exp(z)``, ``z = (float32(logit) - m) * inv_temperature``
  measured from its largest ``m`` so far (0 where the logit equals it, as
  :func:`specsample.probs.scaled_logits`), updated with one exponential per logit, ``e =
  exp(-|z|)``: ``sum * e + 1`` when the logit is a new largest (the old sum rescaled), else
  ``sum + e``.

The loop needs no reduction across lanes. At the end the lanes are combined: the row's
largest logit, the smallest index among the lanes holding it (so ties go to the first
index, as :meth:`torch.Tensor.max` does), and the lanes' sums rescaled to the row's largest
by ``exp((m_lane - m) * inv_temperature)``. A ``+inf`` logit is counted once per ``+inf``
token and every finite one as 0: the uniform distribution over the ``+inf`` tokens.

The rows then get their statistics as :func:`~specsample.probs.row_norms` writes them: the
argmax (0 for a row without a distribution), the largest logit as ``shift``, ``log_norm``
the log of the sum, ``cutoff`` ``-inf`` (NaN, with ``log_norm`` ``+inf`` and ``shift`` 0,
for a row whose largest logit is NaN or ``-inf``). The argmax and shift are exact; the
log-norm agrees to float32 rounding (the sum's order differs).

On a GPU one program reads :data:`COLUMNS` columns at a time; when there are too few rows
to occupy the device, each row's blocks are split among several programs whose partial
results (largest logit, NaN flag, sum, first index) a second launch combines as the lanes
are combined, so
every logit is still read once. Under Triton's interpreter a program handles many rows at a
time. Every launch parameter comes from shapes and the device's multiprocessor count:
nothing reads a device tensor, and nothing synchronises.

:func:`specsample.kernels.triton.filters.row_norms`, the Triton backend's statistics of a
plan, runs it for every batch, and the filter kernel after it for a batch where a request
may have a top-k, top-p or min-p filter.

The module is imported twice, as :mod:`specsample.kernels.triton.gumbel` is: as the host
side, which never imports triton, and, on the first launch in a mode, as that mode's kernel
module (see :func:`specsample.kernels.triton.launch.mode_kernel`).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from specsample.kernels.triton.launch import (
    MODE_PACKAGES,
    _check_device,
    _next_power_of_two,
    _sm_count,
    interpreting,
    mode_kernel,
)
from specsample.probs import RowNorms
from specsample.rules.rows import unit_columns

COLUMNS = 2048
"""Vocabulary columns a compiled program reads at a time (a smaller vocabulary: the power of
two at or above it); read at each launch."""

INTERPRETER_COLUMNS = 256
"""Columns a program reads at a time under the interpreter; read at each launch."""

INTERPRETER_SPLITS = 1
"""Programs sharing a row's blocks under the interpreter (tests raise it to run the combining
launch); read at each launch."""

_PROGRAMS_PER_SM = 4
_INTERPRETER_ELEMENTS = 1 << 15
_LOGIT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)

# The ``PHASE`` values of the kernel.
_WHOLE = 0
_PARTIAL = 1
_COMBINE = 2

_KERNEL_COPY = (__package__ or "").rpartition(".")[2] in MODE_PACKAGES.values()
"""Whether this copy is a mode's kernel module (see :func:`_kernel`), not the host side."""


def _kernel() -> Any:
    """The statistics kernel for the current mode (compiled or interpreted), loaded once."""
    return mode_kernel(__name__.rpartition(".")[2], "_stats_kernel")


class _Config(NamedTuple):
    """Launch parameters of one call, decided on the host from shapes."""

    rows_per_program: int
    cols: int
    n_blocks: int
    splits: int
    iters_per_split: int
    warps: int


def _config(device: torch.device, rows: int, vocab: int) -> _Config:
    """Rows per program, columns per block and the split of each row's blocks."""
    interpreted = interpreting() or device.type != "cuda"
    cols = min(INTERPRETER_COLUMNS if interpreted else COLUMNS, _next_power_of_two(vocab))
    n_blocks = -(-vocab // cols)
    if interpreted:
        tile = 1 << ((_INTERPRETER_ELEMENTS // cols).bit_length() - 1)
        per_program = max(1, min(_next_power_of_two(rows), tile))
        wanted = INTERPRETER_SPLITS
    else:
        per_program = 1
        index = device.index if device.index is not None else torch.cuda.current_device()
        wanted = -(-_PROGRAMS_PER_SM * _sm_count(index) // rows)
    splits = max(1, min(n_blocks, wanted))
    per_split = -(-n_blocks // splits)
    splits = -(-n_blocks // per_split)
    warps = 8 if cols >= 2048 else 4
    return _Config(per_program, cols, n_blocks, splits, per_split, warps)


def _check(logits: torch.Tensor, inv_temperature: torch.Tensor) -> None:
    """Refuse arguments :func:`logit_norms` cannot take (naming the argument)."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a tensor, got {type(logits).__name__}")
    if not isinstance(inv_temperature, torch.Tensor):
        raise TypeError(f"inv_temperature must be a tensor, got {type(inv_temperature).__name__}")
    if logits.dtype not in _LOGIT_DTYPES:
        raise TypeError(f"logits must be float32, float16, bfloat16 or float64, got {logits.dtype}")
    if inv_temperature.dtype != torch.float32:
        raise TypeError(f"inv_temperature must be float32, got {inv_temperature.dtype}")
    if logits.dim() != 2 or logits.shape[1] == 0:
        raise ValueError(
            f"logits must have shape [rows, vocab] with vocab >= 1, got {tuple(logits.shape)}"
        )
    if inv_temperature.shape != logits.shape[:1]:
        raise ValueError(
            f"inv_temperature must have shape ({logits.shape[0]},), "
            f"got {tuple(inv_temperature.shape)}"
        )


def logit_norms(
    logits: torch.Tensor, inv_temperature: torch.Tensor, *, need_norm: bool = True
) -> RowNorms:
    """:func:`specsample.probs.row_norms` of rows without a filter, by the kernel.

    Parameters
    ----------
    logits : torch.Tensor
        ``[rows, vocab]`` float32, float16, bfloat16 or float64, each row read once (a row
        stride is kept; columns are made contiguous when they are not).
    inv_temperature : torch.Tensor
        ``[rows]`` float32 ``1 / T`` (1 for greedy rows), on the logits' device.
    need_norm : bool
        Compute ``shift`` and ``log_norm`` (without, no exponential is taken: ``shift`` is
        0 and ``log_norm`` NaN, as in :func:`~specsample.probs.row_norms`).

    Returns
    -------
    RowNorms
        ``[rows]`` each; ``cutoff`` is ``-inf`` (NaN for a row without a distribution).

    Raises
    ------
    TypeError
        ``logits`` or ``inv_temperature`` of another type or dtype.
    ValueError
        Shapes other than ``[rows, vocab]`` and ``[rows]``, or tensors on two devices.
    RuntimeError
        Tensors the kernels cannot run on here (CPU tensors without ``TRITON_INTERPRET=1``).

    Examples
    --------
    >>> import torch
    >>> from specsample.kernels import triton as kernels
    >>> from specsample.probs import row_norms
    >>> logits = torch.tensor([[1.0, 3.0, 3.0, 0.0], [float("nan"), 0.0, 1.0, 2.0]])
    >>> compute = logit_norms if kernels.supports(logits) else row_norms
    >>> s = compute(logits, torch.ones(2))
    >>> s.argmax.tolist(), s.shift.tolist(), s.cutoff.tolist()
    ([1, 0], [3.0, 0.0], [-inf, nan])
    >>> round(float(s.log_norm[0]), 4), float(s.log_norm[1])
    (0.7817, inf)
    """
    _check(logits, inv_temperature)
    _check_device(logits, inv_temperature)
    logits = unit_columns(logits)
    inv = inv_temperature.contiguous()
    rows = logits.shape[0]
    device = logits.device
    cutoff = torch.empty(rows, dtype=torch.float32, device=device)
    log_norm = torch.empty(rows, dtype=torch.float32, device=device)
    shift = torch.empty(rows, dtype=torch.float32, device=device)
    argmax = torch.empty(rows, dtype=torch.int64, device=device)
    norms = RowNorms(inv, cutoff, log_norm, argmax, shift)
    if rows == 0:
        return norms
    _launch(logits, norms, need_norm)
    return norms


def _launch(logits: torch.Tensor, norms: RowNorms, need_norm: bool) -> None:
    """Fill ``norms`` (allocated for the rows) by one launch, or two when rows are split."""
    rows, vocab = logits.shape
    device = logits.device
    config = _config(device, rows, vocab)
    parts = rows * config.splits if config.splits > 1 else 1
    partial = torch.empty(2, parts, dtype=torch.float64, device=device)
    first = torch.empty(parts, dtype=torch.int64, device=device)
    args = [
        logits,
        logits.stride(0),
        norms.inv_temperature,
        norms.cutoff,
        norms.log_norm,
        norms.shift,
        norms.argmax,
        partial,
        first,
        rows,
        vocab,
        config.n_blocks,
        config.splits,
        config.iters_per_split,
    ]
    constants = {
        "R": config.rows_per_program,
        "COLS": config.cols,
        "SPLITS_PAD": _next_power_of_two(config.splits),
        "WIDE": logits.dtype == torch.float64,
        "NORM": need_norm,
        "num_warps": config.warps,
        "enable_fp_fusion": False,
    }
    kernel = _kernel()
    tiles = -(-rows // config.rows_per_program)
    if config.splits == 1:
        kernel[(tiles,)](*args, **constants, PHASE=_WHOLE)
        return
    kernel[(tiles, config.splits)](*args, **constants, PHASE=_PARTIAL)
    kernel[(tiles,)](*args, **constants, PHASE=_COMBINE)


if _KERNEL_COPY:
    import triton
    import triton.language as tl

    from ._common import _bound, _exp, _log

    @triton.jit
    def _gap(x, top):
        """``x - top`` in float32, 0 where they are equal (infinities included), as
        :func:`specsample.probs.scaled_logits` measures a logit from the largest; no NaN."""
        same = x == top
        return tl.where(same, 0.0, x) - tl.where(same, 0.0, top)

    @triton.jit
    def _scan(row, live, inv, first, last, vocab, R: tl.constexpr, COLS: tl.constexpr,
              WIDE: tl.constexpr, NORM: tl.constexpr):  # fmt: skip
        """Blocks ``first .. last - 1`` of the rows at pointers ``row [R]``: the largest
        logit (``-inf`` when none; NaNs left out), the sum of ``exp(z)`` measured from it,
        the first index holding it, and whether a NaN was seen, each ``[R]``.

        Each of the ``COLS`` lanes keeps its own largest logit, first index, NaN flag and
        sum measured from its largest, so the loop needs no reduction across lanes; one
        exponential per logit, ``e = exp(-|z|)`` with ``z`` from the lane's largest so far,
        updates the sum: ``sum * e + 1`` when the logit is a new largest, else ``sum + e``.
        """
        value = tl.float64 if WIDE else tl.float32
        cols = tl.arange(0, COLS).to(tl.int64)
        lane_top = tl.full([R, COLS], float("-inf"), value)
        lane_sum = tl.zeros([R, COLS], tl.float32)
        lane_best = tl.zeros([R, COLS], tl.int32)
        lane_nan = tl.zeros([R, COLS], tl.int32)
        for block in range(_bound(first), _bound(last)):
            at = block * COLS + cols
            mask = live[:, None] & (at[None, :] < vocab)
            x = tl.load(row[:, None] + at[None, :], mask=mask, other=float("-inf")).to(value)
            seen = x != x
            lane_nan = tl.where(seen, 1, lane_nan)
            x = tl.where(seen, float("-inf"), x)
            higher = x > lane_top
            if NORM:
                gap = _gap(x.to(tl.float32), lane_top.to(tl.float32))
                e = _exp(-tl.abs(gap) * inv[:, None])
                lane_sum = tl.where(higher, lane_sum * e + 1.0, lane_sum + e)
            lane_best = tl.where(higher, at[None, :].to(tl.int32), lane_best)
            lane_top = tl.where(higher, x, lane_top)
        top = tl.max(lane_top, axis=1)
        best = tl.min(tl.where(lane_top == top[:, None], lane_best, vocab), axis=1)
        gap = _gap(lane_top.to(tl.float32), top.to(tl.float32)[:, None])
        total = tl.sum(lane_sum * _exp(gap * inv[:, None]), axis=1)
        return top, total, best.to(tl.int64), tl.max(lane_nan, axis=1)

    @triton.jit
    def _combine(partial, first, rows, inv, live, parts, splits, SPLITS_PAD: tl.constexpr):
        """The statistics of whole rows from their ``splits`` partial results, each ``[R]``."""
        s = tl.arange(0, SPLITS_PAD).to(tl.int64)
        at = rows[:, None] * splits + s[None, :]
        mask = live[:, None] & (s[None, :] < splits)
        tops = tl.load(partial + at, mask=mask, other=float("-inf"))
        sums = tl.load(partial + parts + at, mask=mask, other=0.0).to(tl.float32)
        firsts = tl.load(first + at, mask=mask, other=0)
        seen = tops != tops
        nan = tl.max(seen.to(tl.int32), axis=1)
        tops = tl.where(seen, float("-inf"), tops)
        top = tl.max(tops, axis=1)
        best = tl.min(tl.where(tops == top[:, None], firsts, 1 << 62), axis=1)
        gap = _gap(tops.to(tl.float32), top.to(tl.float32)[:, None])
        return top, tl.sum(sums * _exp(gap * inv[:, None]), axis=1), best, nan

    @triton.jit
    def _finish(outputs, rows, live, top, total, best, nan, NORM: tl.constexpr):
        """Store the statistics of whole rows (``outputs``: cutoff, log-norm, shift, argmax),
        every output of every live row (without ``NORM``: ``shift`` 0, ``log_norm`` NaN)."""
        cutoff, log_norm, shift, argmax = outputs
        usable = (nan == 0) & (top > float("-inf"))
        tl.store(argmax + rows, tl.where(usable, best, 0), mask=live)
        tl.store(cutoff + rows, tl.where(usable, float("-inf"), float("nan")), mask=live)
        if NORM:
            tl.store(shift + rows, tl.where(usable, top.to(tl.float32), 0.0), mask=live)
            norm = _log(tl.where(usable, total, 1.0))
            tl.store(log_norm + rows, tl.where(usable, norm, float("inf")), mask=live)
        else:
            tl.store(shift + rows, tl.zeros_like(total), mask=live)
            tl.store(log_norm + rows, tl.full(total.shape, float("nan"), tl.float32), mask=live)

    @triton.jit(do_not_specialize=("rows_total", "n_blocks", "splits", "iters_per_split"))
    def _stats_kernel(
        logits, stride, inv_t, cutoff, log_norm, shift, argmax, partial, first,
        rows_total, vocab, n_blocks, splits, iters_per_split,
        R: tl.constexpr, COLS: tl.constexpr, SPLITS_PAD: tl.constexpr, WIDE: tl.constexpr,
        NORM: tl.constexpr, PHASE: tl.constexpr,
    ):  # fmt: skip
        """``R`` rows per program: ``PHASE`` 0 whole rows, 1 the blocks of split
        ``program_id(1)`` into the partial results, 2 the partial results combined."""
        rows = (tl.program_id(0) * R + tl.arange(0, R)).to(tl.int64)
        live = rows < rows_total
        inv = tl.load(inv_t + rows, mask=live, other=1.0)
        outputs = (cutoff, log_norm, shift, argmax)
        pointers = logits + rows * stride
        if PHASE == 2:
            parts = rows_total * splits
            top, total, best, nan = _combine(
                partial, first, rows, inv, live, parts, splits, SPLITS_PAD
            )
            _finish(outputs, rows, live, top, total, best, nan, NORM)
        else:
            split = tl.program_id(1).to(tl.int64)
            begin = split * iters_per_split
            end = tl.minimum(begin + iters_per_split, n_blocks)
            top, total, best, nan = _scan(
                pointers, live, inv, begin, end, vocab, R, COLS, WIDE, NORM
            )
            if PHASE == 0:
                _finish(outputs, rows, live, top, total, best, nan, NORM)
            else:
                parts = rows_total * splits
                at = rows * splits + split
                top = tl.where(nan > 0, float("nan"), top.to(tl.float64))
                tl.store(partial + at, top, mask=live)
                tl.store(partial + parts + at, total.to(tl.float64), mask=live)
                tl.store(first + at, best, mask=live)
