"""Types and constants every layer shares: results, the vocabulary block, row views.

The rules (:mod:`specsample.rules`), the backends, the kernels and the public API all speak
of a step's result and read rows the same way; these live here, below all of them, so that
no layer imports another sideways for them.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

BLOCK = 1024
"""Tokens per vocabulary block of the two-level inverse CDF (rules and kernels alike)."""


class VerifyResult(NamedTuple):
    """What a verification step produced.

    Attributes
    ----------
    token_ids : torch.Tensor
        ``[batch, k + 1]`` int64: the accepted drafts, then one more token (the residual draw
        at the first rejection, or the bonus token), then ``-1`` padding.
    num_accepted : torch.Tensor
        ``[batch]`` int64: drafts accepted in order; ``num_accepted + 1`` tokens are emitted.
    """

    token_ids: torch.Tensor
    num_accepted: torch.Tensor


class TreeVerifyResult(NamedTuple):
    """What a tree verification step produced.

    Attributes
    ----------
    path : torch.Tensor
        ``[batch, max_depth + 1]`` int64: the accepted path as node indices, starting with
        the root ``0``, then ``-1`` padding.
    token_ids : torch.Tensor
        ``[batch, max_depth + 1]`` int64: the tokens of the accepted nodes (the root
        excluded), then one more token, then ``-1`` padding.
    num_emitted : torch.Tensor
        ``[batch]`` int64: tokens emitted, the number of accepted nodes plus one.
    """

    path: torch.Tensor
    token_ids: torch.Tensor
    num_emitted: torch.Tensor


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
