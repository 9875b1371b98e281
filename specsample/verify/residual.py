"""Sampling the residual distribution ``normalize(max(0, q - p))`` at one row per sequence.

The residual is built lazily: only the row at each sequence's first rejected position is
read, never all ``k`` positions. Sampling is an inverse CDF with one uniform per row, done
in two levels so that no ``[batch, vocab]`` prefix sum is ever formed:

1. the vocabulary is cut into blocks of ``block`` tokens; one pass over the selected rows,
   in column chunks small enough to stay in cache, computes per block the target mass
   ``sum q`` and the overlap mass ``sum min(q, p)``; their difference is the residual mass
   of the block (it is exactly zero where ``q <= p`` on the whole block, because both sums
   then add the same numbers in the same order, and float addition is monotone);
2. the uniform picks a block from the float64 prefix sum of the block masses, then a token
   inside it from the float64 prefix sum of ``max(0, q - p)`` over that block alone.

No clamp to a tiny positive value is ever applied: a token whose residual is zero is never
returned. A row whose residual has no mass (``q <= p`` everywhere, which a valid input only
reaches when ``q == p`` and then rejects with probability 0) samples ``q`` itself; so does a
row whose mass is not finite. Whatever the input, the result lies in ``[0, vocab)``.
"""

from __future__ import annotations

import torch

__all__ = ["BLOCK", "flat_rows", "sample_residual"]

BLOCK = 1024
"""Tokens per vocabulary block of the two-level inverse CDF."""

_SUB = 32
_CPU_CHUNK_ELEMENTS = 1 << 18
_DEVICE_CHUNK_ELEMENTS = 1 << 26


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
    flat = probs.as_strided((rows, vocab), (s1, 1), probs.storage_offset())
    return flat, stride


def _chunk_width(batch: int, vocab: int, device: torch.device) -> int:
    budget = _CPU_CHUNK_ELEMENTS if device.type == "cpu" else _DEVICE_CHUNK_ELEMENTS
    width = max(BLOCK, (budget // max(batch, 1)) // BLOCK * BLOCK)
    return min(width, -(-vocab // BLOCK) * BLOCK)


def _block_masses(
    target: torch.Tensor, target_rows: torch.Tensor, draft: torch.Tensor, draft_rows: torch.Tensor
) -> torch.Tensor:
    """Per-block ``sum q`` and ``sum min(q, p)`` of the selected rows, ``[2, batch, blocks]``."""
    batch, vocab = target_rows.shape[0], target.shape[-1]
    width = _chunk_width(batch, vocab, target.device)
    masses = torch.empty(2, batch, -(-vocab // BLOCK), dtype=torch.float32, device=target.device)
    buf = torch.empty(2, batch, width, dtype=target.dtype, device=target.device)
    for start in range(0, vocab, width):
        stop = min(start + width, vocab)
        chunk = buf if stop - start == width else buf.new_empty(2, batch, stop - start)
        torch.index_select(target[:, start:stop], 0, target_rows, out=chunk[0])
        torch.index_select(draft[:, start:stop], 0, draft_rows, out=chunk[1])
        torch.minimum(chunk[0], chunk[1], out=chunk[1])
        full, first = (stop - start) // BLOCK, start // BLOCK
        if full:
            blocks = chunk[:, :, : full * BLOCK].view(2, batch, full, BLOCK)
            torch.sum(blocks, dim=-1, dtype=torch.float32, out=masses[:, :, first : first + full])
        if (stop - start) % BLOCK:
            masses[:, :, first + full] = chunk[:, :, full * BLOCK :].sum(
                dim=-1, dtype=torch.float32
            )
    return masses


def _pick(weights: torch.Tensor, uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-CDF choice of a cell of non-negative ``weights [batch, n]`` by ``uniform [batch]``.

    Returns the cell (one with positive weight whenever the row has any, and in ``[0, n)``
    whatever the input) and the uniform rescaled to the inside of that cell, so that a
    hierarchy of cells can be descended with a single uniform.
    """
    cum = weights.to(torch.float64).cumsum(dim=-1)
    total = cum[:, -1:].contiguous()
    x = uniform.unsqueeze(-1) * total
    cell = torch.minimum(
        torch.searchsorted(cum, x, right=True), torch.searchsorted(cum, total, right=False)
    ).clamp_(max=weights.shape[-1] - 1)
    below = torch.where(cell > 0, cum.gather(1, (cell - 1).clamp(min=0)), torch.zeros_like(x))
    inside = (x - below) / (cum.gather(1, cell) - below)
    return cell.squeeze(-1), inside.squeeze(-1).nan_to_num_(0.0).clamp_(0.0, 1.0)


def _segments(
    probs: torch.Tensor, rows: torch.Tensor, start: torch.Tensor, width: int
) -> torch.Tensor:
    """``probs[rows[i], start[i] : start[i] + width]`` for each ``i``, as ``[batch, width]``.

    Indexes a sliding-window view of the rows, so one contiguous segment is copied per row.
    """
    n_rows, vocab = probs.shape
    windows = probs.as_strided(
        (n_rows, vocab - width + 1, width), (probs.stride(0), 1, 1), probs.storage_offset()
    )
    return windows[rows, start].to(torch.float32)


def sample_residual(
    target: torch.Tensor,
    target_rows: torch.Tensor,
    draft: torch.Tensor,
    draft_rows: torch.Tensor,
    uniform: torch.Tensor,
) -> torch.Tensor:
    """Draw one token per row from ``normalize(max(0, target[row] - draft[row]))``.

    Parameters
    ----------
    target : torch.Tensor
        ``[rows, vocab]`` target probabilities ``q`` (float32, float16 or bfloat16).
    target_rows : torch.Tensor
        ``[batch]`` int64: which row of ``target`` each draw reads.
    draft : torch.Tensor
        ``[rows, vocab]`` draft probabilities ``p``.
    draft_rows : torch.Tensor
        ``[batch]`` int64: which row of ``draft`` each draw reads.
    uniform : torch.Tensor
        ``[batch]`` float64 uniforms in ``[0, 1)``, one per draw.

    Returns
    -------
    torch.Tensor
        ``[batch]`` int64 token ids in ``[0, vocab)``. Rows whose residual has no positive
        finite mass are drawn from their target row instead.

    Examples
    --------
    >>> import torch
    >>> q = torch.tensor([[0.5, 0.5, 0.0]])
    >>> p = torch.tensor([[0.5, 0.0, 0.5]])
    >>> row, u = torch.tensor([0]), torch.tensor([0.99], dtype=torch.float64)
    >>> sample_residual(q, row, p, row, u)
    tensor([1])
    """
    vocab = target.shape[-1]
    target_mass, overlap_mass = _block_masses(target, target_rows, draft, draft_rows)
    residual_mass = target_mass - overlap_mass
    use_target = ~(residual_mass.sum(dim=-1, dtype=torch.float64) > 0)
    block, u = _pick(torch.where(use_target.unsqueeze(-1), target_mass, residual_mass), uniform)

    width = min(BLOCK, vocab)
    first = block * BLOCK
    start = first.clamp(max=vocab - width)
    q = _segments(target, target_rows, start, width)
    p = _segments(draft, draft_rows, start, width)
    residual = torch.where(use_target.unsqueeze(-1), q, (q - p).clamp_(min=0.0))
    before_block = start.unsqueeze(-1) + torch.arange(width, device=start.device) < first.unsqueeze(
        -1
    )
    residual.masked_fill_(before_block, 0.0)
    offset = torch.zeros_like(start)
    if width == BLOCK:
        parts = residual.view(-1, _SUB, BLOCK // _SUB)
        sub, u = _pick(parts.sum(dim=-1), u)
        residual = parts.gather(1, sub.view(-1, 1, 1).expand(-1, 1, BLOCK // _SUB)).squeeze(1)
        offset = sub * (BLOCK // _SUB)
    token, _ = _pick(residual, u)
    return (start + offset + token).clamp_(min=0, max=vocab - 1)
