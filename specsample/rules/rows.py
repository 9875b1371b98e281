"""Row sources: where the residual draw reads probabilities from.

A verifier reads one row per sequence at the end of a step (the first rejected position, or
the bonus position). The rows can be stored as probabilities or as logits together with
per-row statistics (temperature, cutoff, log-normaliser; see :mod:`specsample.probs`). A
:class:`ProbRows` or :class:`LogitRows` is *selected* with the row indices of a step, and the
selection hands out either a column chunk of every selected row (for the block masses) or a
short segment per row (for the draw inside the chosen block), always as probabilities.
"""

from __future__ import annotations

from typing import Protocol

import torch

from specsample.probs import RowNorms


def flat_rows(probs: torch.Tensor) -> tuple[torch.Tensor, int]:
    """View ``[batch, k, vocab]`` as ``[rows, vocab]`` without copying where strides allow.

    Returns the 2-D view and the row stride of the batch dimension, so that the row of
    ``(b, j)`` is ``b * stride + j``. A tensor whose layout admits no such view (its last
    dimension not contiguous, say) is copied once.

    Examples
    --------
    >>> import torch
    >>> x = torch.arange(24.0).view(2, 4, 3)[:, :3]
    >>> flat, stride = flat_rows(x)
    >>> stride, bool(torch.equal(flat[1 * stride + 2], x[1, 2]))
    (4, True)
    """
    batch, k, vocab = probs.shape
    s0, s1, s2 = probs.stride()
    if s2 != 1 or s1 < vocab or s1 == 0 or s0 % s1 != 0:
        probs = probs.contiguous()
        s0, s1 = probs.stride()[0], probs.stride()[1]
    stride = s0 // s1 if batch > 1 else k
    rows = (batch - 1) * stride + k if batch > 0 else 0
    return probs.as_strided((rows, vocab), (s1, 1)), stride


def unit_columns(rows: torch.Tensor) -> torch.Tensor:
    """``rows [..., vocab]`` with unit column stride, copied only when it has another one.

    The row readers index columns by offset, so every entry point hands them rows whose
    last dimension is contiguous; any row stride is kept.

    Examples
    --------
    >>> import torch
    >>> x = torch.arange(6.0).view(2, 3).t()
    >>> x.stride(), unit_columns(x).stride()
    ((1, 3), (2, 1))
    """
    if rows.dim() == 0 or rows.stride(-1) == 1 or rows.shape[-1] <= 1:
        return rows
    return rows.contiguous()


def _windows(
    rows_2d: torch.Tensor, rows: torch.Tensor, start: torch.Tensor, width: int
) -> torch.Tensor:
    """``rows_2d[rows[i], start[i] : start[i] + width]`` per ``i`` (one segment copy per row)."""
    n_rows, vocab = rows_2d.shape
    windows = rows_2d.as_strided((n_rows, vocab - width + 1, width), (rows_2d.stride(0), 1, 1))
    return windows[rows, start]


def _gather(
    rows_2d: torch.Tensor, rows: torch.Tensor, start: int, stop: int, out: torch.Tensor
) -> torch.Tensor:
    """Columns ``[start, stop)`` of the selected rows into ``out`` (converting the dtype)."""
    columns = rows_2d[:, start:stop]
    if columns.dtype == out.dtype:
        return torch.index_select(columns, 0, rows, out=out)
    return out.copy_(columns.index_select(0, rows))


class Selection(Protocol):
    """The rows of one step, read as probabilities."""

    rows: torch.Tensor
    dtype: torch.dtype
    device: torch.device

    def chunk(self, start: int, stop: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Columns ``[start, stop)`` of every selected row, ``[batch, stop - start]``."""
        ...

    def segment(self, start: torch.Tensor, width: int) -> torch.Tensor:
        """Columns ``[start[i], start[i] + width)`` of row ``i``, float32 ``[batch, width]``."""
        ...


class ProbRows:
    """Rows of probabilities.

    Parameters
    ----------
    probs : torch.Tensor
        ``[rows, vocab]`` (any strides; copied once if its columns are not contiguous),
        float32, float16, bfloat16 or float64; chunks are handed out in float32 (float64
        for float64 rows), so that the residual's arithmetic is never done in half
        precision.

    Examples
    --------
    >>> import torch
    >>> rows = ProbRows(torch.tensor([[0.25, 0.75], [1.0, 0.0]])).select(torch.tensor([1]))
    >>> rows.chunk(0, 2)
    tensor([[1., 0.]])
    """

    def __init__(self, probs: torch.Tensor) -> None:
        self.probs = unit_columns(probs)

    def select(self, rows: torch.Tensor) -> Selection:
        """Bind the ``[batch]`` int64 row indices of a step."""
        return _SelectedProbs(self.probs, rows)


class PositionRows:
    """The rows of a ``[batch, k, vocab]`` probability tensor, selected by (sequence, position).

    The tensor is viewed as ``[rows, vocab]`` once (:func:`flat_rows`, no
    copy where its strides allow); :meth:`at` selects the row of each ``(b, j)``.

    Examples
    --------
    >>> import torch
    >>> probs = torch.tensor([[[0.5, 0.5], [1.0, 0.0]], [[0.0, 1.0], [0.25, 0.75]]])
    >>> PositionRows(probs).at(torch.tensor([1, 0]), torch.tensor([1, 1])).chunk(0, 2)
    tensor([[0.2500, 0.7500],
            [1.0000, 0.0000]])
    """

    def __init__(self, probs: torch.Tensor) -> None:
        rows, self.stride = flat_rows(probs)
        self.rows = ProbRows(rows)

    def at(self, sequence: torch.Tensor, position: torch.Tensor) -> Selection:
        """The rows of ``(sequence, position)`` (broadcast together), flattened in order."""
        return self.rows.select((sequence * self.stride + position).reshape(-1))


class _SelectedProbs:
    def __init__(self, probs: torch.Tensor, rows: torch.Tensor) -> None:
        self.probs, self.rows, self.device = probs, rows, probs.device
        self.dtype = torch.float64 if probs.dtype == torch.float64 else torch.float32

    def chunk(self, start: int, stop: int, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None:
            return self.probs[:, start:stop].index_select(0, self.rows).to(self.dtype)
        return _gather(self.probs, self.rows, start, stop, out)

    def segment(self, start: torch.Tensor, width: int) -> torch.Tensor:
        return _windows(self.probs, self.rows, start, width).to(torch.float32)


class LogitRows:
    """Rows of logits with their sampling statistics.

    Row ``r`` stands for the distribution ``q(x) = exp(z(x) - log_norm[r])`` where
    ``z = (logits[r] - shift[r]) * inv_temperature[r]`` (see
    :func:`specsample.probs.scaled_logits`), for the tokens with ``z(x) >= cutoff[r]``, and
    ``q(x) = 0`` for the others (all of them when ``cutoff[r]`` is NaN).

    Parameters
    ----------
    logits : torch.Tensor
        ``[rows, vocab]`` logits (float32, float16 or bfloat16; any strides).
    norms : RowNorms
        ``[rows]`` statistics, as computed by :func:`specsample.probs.row_norms`.

    Examples
    --------
    >>> import math, torch
    >>> from specsample.probs import row_norms
    >>> logits = torch.tensor([[0.0, math.log(3.0)]])
    >>> rows = LogitRows(logits, row_norms(logits, torch.ones(1)))
    >>> rows.select(torch.tensor([0])).chunk(0, 2)
    tensor([[0.2500, 0.7500]])
    """

    def __init__(self, logits: torch.Tensor, norms: RowNorms) -> None:
        self.logits = unit_columns(logits)
        self.norms = norms

    def select(self, rows: torch.Tensor) -> Selection:
        """Bind the ``[batch]`` int64 row indices of a step."""
        return _SelectedLogits(self, rows)


class _SelectedLogits:
    def __init__(self, source: LogitRows, rows: torch.Tensor) -> None:
        self.logits, self.rows, self.dtype = source.logits, rows, torch.float32
        self.device = source.logits.device
        norms = source.norms
        self.scale = norms.inv_temperature[rows].unsqueeze(-1)
        self.shift = norms.shift[rows].unsqueeze(-1)
        self.cutoff = norms.cutoff[rows].unsqueeze(-1)
        self.log_norm = norms.log_norm[rows].unsqueeze(-1)

    def _to_probs(self, x: torch.Tensor) -> torch.Tensor:
        """Probabilities from float32 logits ``x``, in place (callers read the buffer).

        The arithmetic of :func:`specsample.probs.scaled_logits`, then ``exp(z - log_norm)``.
        """
        top = x == self.shift
        z = x.sub_(self.shift).mul_(self.scale).masked_fill_(top, 0.0)
        dropped = (z >= self.cutoff).logical_not_()
        return z.sub_(self.log_norm).exp_().masked_fill_(dropped, 0.0)

    def chunk(self, start: int, stop: int, out: torch.Tensor | None = None) -> torch.Tensor:
        if out is None:
            out = self.logits[:, start:stop].index_select(0, self.rows).to(torch.float32)
        return self._to_probs(_gather(self.logits, self.rows, start, stop, out))

    def segment(self, start: torch.Tensor, width: int) -> torch.Tensor:
        return self._to_probs(_windows(self.logits, self.rows, start, width).to(torch.float32))
