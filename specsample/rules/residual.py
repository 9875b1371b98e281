"""Sampling the residual distribution ``normalize(max(0, q - p))`` at one row per sequence.

The residual is built lazily: only the row at each sequence's first rejected position is
read, never all ``k`` positions. Sampling is an inverse CDF with one uniform per row, done
over a hierarchy of cells so that no ``[batch, vocab]`` prefix sum is ever formed:

1. the vocabulary is cut into blocks of :data:`BLOCK` tokens; one pass over the selected
   rows, in column chunks small enough to stay in cache, computes per block the target mass
   ``sum q`` and the residual mass ``sum max(q - p, 0)``, a sum of non-negative terms that
   is positive exactly when some token of the block has ``q > p`` (for a one-hot draft,
   the block holding the draft is summed again without it);
2. the uniform picks a block from the float64 prefix sum of the block masses, then a
   32-token part of it, then a token, each from a float64 prefix sum of
   ``max(0, q - p)`` over the chosen cell alone.

Every sum is accumulated in float64 (the terms themselves are float32, or float64 for
float64 rows). Backends add in different orders; in float64 the sums they reach differ by
about ``1e-16`` relative, so they draw the same token unless a uniform falls that close to a
cell boundary. (In float32, sums added in another order shift the finer levels of the
hierarchy enough to change about one draw in 30,000.)

The draft side may be dense rows (probabilities), a one-hot draft (a drafter without
probabilities: ``p = delta_x``, so the residual is ``q`` with ``x`` removed), or absent
(the bonus position: the draw is from ``q`` itself).

No clamp to a tiny positive value is ever applied: a token whose residual is zero is never
returned. A row whose residual has no mass (``q <= p`` everywhere, which a valid input only
reaches when ``q == p`` and then rejects with probability 0) samples ``q`` itself; so does a
row whose mass is not finite. Whatever the input, the result lies in ``[0, vocab)``.
"""

from __future__ import annotations

import torch

from specsample.random import inverse_cdf
from specsample.rules.rows import LogitRows, ProbRows, Selection

BLOCK = 1024
"""Tokens per vocabulary block of the two-level inverse CDF (rules and kernels alike)."""

_SUB = 32
_CPU_CHUNK_ELEMENTS = 1 << 18
_DEVICE_CHUNK_ELEMENTS = 1 << 26


def _chunk_width(batch: int, vocab: int, device: torch.device) -> int:
    budget = _CPU_CHUNK_ELEMENTS if device.type == "cpu" else _DEVICE_CHUNK_ELEMENTS
    width = max(BLOCK, (budget // max(batch, 1)) // BLOCK * BLOCK)
    return min(width, -(-vocab // BLOCK) * BLOCK)


def block_masses(
    target: Selection,
    vocab: int,
    *,
    draft: Selection | None = None,
    target_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-block ``sum q`` and (for a dense draft) ``sum max(w q - p, 0)``, ``[2, rows, blocks]``
    float64.

    Parameters
    ----------
    target, draft : Selection
        The selected target rows ``q`` and (optionally) dense draft rows ``p``.
    vocab : int
        Vocabulary size.
    target_scale : torch.Tensor, optional
        ``[rows]`` float32 factor ``w`` on the target (1 when omitted).

    Eagerly, the rows are processed in cache-sized column chunks written into reused
    buffers; under :func:`torch.compile` the same sums are written functionally and left to
    the compiler to fuse. Without a dense draft the second row is left at zero.

    Examples
    --------
    >>> import torch
    >>> from specsample.rules.rows import ProbRows
    >>> row = torch.tensor([0])
    >>> q = ProbRows(torch.tensor([[0.5, 0.5]])).select(row)
    >>> p = ProbRows(torch.tensor([[0.75, 0.25]])).select(row)
    >>> block_masses(q, 2, draft=p)
    tensor([[[1.0000]],
    <BLANKLINE>
            [[0.2500]]], dtype=torch.float64)
    """
    batch = target.rows.shape[0]
    scale = target_scale.unsqueeze(-1) if target_scale is not None else None
    device = target.device
    if torch.compiler.is_compiling():
        t = target.chunk(0, vocab)
        w = t if scale is None else t * scale
        r = (w - draft.chunk(0, vocab)).clamp(min=0.0) if draft is not None else torch.zeros_like(t)
        padded = torch.nn.functional.pad(torch.stack([t, r]), (0, -vocab % BLOCK))
        return padded.view(2, batch, -1, BLOCK).sum(dim=-1, dtype=torch.float64)
    masses = torch.zeros(2, batch, -(-vocab // BLOCK), dtype=torch.float64, device=device)
    sums = masses if draft is not None else masses[:1]
    width = min(_chunk_width(batch, vocab, device), vocab)
    parts = sums.shape[0]
    buf = torch.empty(parts * batch * width, dtype=target.dtype, device=device)
    for start in range(0, vocab, width):
        stop = min(start + width, vocab)
        chunk = buf[: parts * batch * (stop - start)].view(parts, batch, stop - start)
        t = target.chunk(start, stop, out=chunk[0])
        if draft is not None:
            p = draft.chunk(start, stop, out=chunk[1])
            if scale is None:
                torch.sub(t, p, out=p).clamp_(min=0.0)
            else:
                torch.addcmul(p, t, scale, value=-1.0, out=p).clamp_(max=0.0).neg_()
        full, first = (stop - start) // BLOCK, start // BLOCK
        if full:
            blocks = chunk[:, :, : full * BLOCK].view(chunk.shape[0], batch, full, BLOCK)
            torch.sum(blocks, dim=-1, dtype=torch.float64, out=sums[:, :, first : first + full])
        if (stop - start) % BLOCK:
            tail = chunk[:, :, full * BLOCK :]
            sums[:, :, first + full] = tail.sum(dim=-1, dtype=torch.float64)
    return masses


def _block_segment(target: Selection, block: torch.Tensor, vocab: int) -> tuple[torch.Tensor, ...]:
    """The target values of block ``block[i]`` of row ``i``, ``[batch, min(BLOCK, vocab)]``.

    Also returns the first column read and the token id of every column; columns before the
    block (read when the last block is shorter than :data:`BLOCK`) are zeroed.
    """
    width = min(BLOCK, vocab)
    first = block * BLOCK
    start = first.clamp(max=vocab - width)
    token_ids = start.unsqueeze(-1) + torch.arange(width, device=start.device)
    q = target.segment(start, width).masked_fill_(token_ids < first.unsqueeze(-1), 0.0)
    return q, start, token_ids


def sample_residual(
    target: Selection,
    uniform: torch.Tensor,
    vocab: int,
    *,
    draft: Selection | None = None,
    draft_weight: torch.Tensor | None = None,
    draft_token: torch.Tensor | None = None,
    target_scale: torch.Tensor | None = None,
    masses: torch.Tensor | None = None,
) -> torch.Tensor:
    """Draw one token per row from ``normalize(max(0, w q - p))`` (``w = 1`` by default).

    Parameters
    ----------
    target : Selection
        The target rows ``q`` of the step (see :mod:`specsample.rules.rows`).
    uniform : torch.Tensor
        ``[batch]`` float64 uniforms in ``[0, 1)``, one per draw.
    vocab : int
        Vocabulary size.
    draft : Selection, optional
        Dense draft rows ``p``.
    draft_weight : torch.Tensor, optional
        ``[batch]`` float32 factor on the dense draft row: 1 where the row was rejected,
        0 where no draft applies (the bonus position), so that row samples ``q``.
    draft_token : torch.Tensor, optional
        ``[batch]`` int64 one-hot drafts (a drafter without probabilities); an id outside
        ``[0, vocab)`` means no draft for that row. Exclusive with ``draft``.
    target_scale : torch.Tensor, optional
        ``[batch]`` float32 factor ``w`` on the target, with a dense draft (block
        verification's residual ``max(w q - p, 0)``).
    masses : torch.Tensor, optional
        ``[2, batch, blocks]`` the result of :func:`block_masses` for these rows, when the
        caller already has it.

    Returns
    -------
    torch.Tensor
        ``[batch]`` int64 token ids in ``[0, vocab)``. Rows whose residual has no positive
        finite mass are drawn from their target row instead.

    Examples
    --------
    >>> import torch
    >>> from specsample.rules.rows import ProbRows
    >>> row, u = torch.tensor([0]), torch.tensor([0.99], dtype=torch.float64)
    >>> q = ProbRows(torch.tensor([[0.5, 0.5, 0.0]])).select(row)
    >>> p = ProbRows(torch.tensor([[0.5, 0.0, 0.5]])).select(row)
    >>> sample_residual(q, u, 3, draft=p)
    tensor([1])
    >>> sample_residual(q, u, 3, draft_token=torch.tensor([1]))
    tensor([0])
    """
    if masses is None:
        masses = block_masses(target, vocab, draft=draft, target_scale=target_scale)
    target_mass, residual_mass = masses[0], masses[1]
    keep = None
    if draft is not None and draft_weight is not None:
        keep = draft_weight.unsqueeze(-1) > 0
        residual_mass = torch.where(keep, residual_mass, target_mass)
    elif draft is None:
        residual_mass = target_mass
    excluded = None
    if draft_token is not None:
        token = draft_token.to(torch.int64)
        excluded = torch.where((token >= 0) & (token < vocab), token, -1).unsqueeze(-1)
        q, _, token_ids = _block_segment(target, token.clamp(0, vocab - 1) // BLOCK, vocab)
        without = q.masked_fill_(token_ids == excluded, 0.0).sum(
            dim=-1, keepdim=True, dtype=torch.float64
        )
        own_block = (token.clamp(0, vocab - 1) // BLOCK).unsqueeze(-1)
        residual_mass = torch.where(
            excluded >= 0, residual_mass.scatter(1, own_block, without), residual_mass
        )
    use_target = ~(residual_mass.sum(dim=-1, dtype=torch.float64) > 0)
    block, u = inverse_cdf(
        torch.where(use_target.unsqueeze(-1), target_mass, residual_mass), uniform
    )

    q, start, token_ids = _block_segment(target, block, vocab)
    residual = q
    if draft is not None:
        p = draft.segment(start, q.shape[-1])
        if target_scale is None:
            residual = (q - p).clamp_(min=0.0)
        else:
            scale = target_scale.unsqueeze(-1).to(q.dtype)
            residual = torch.addcmul(p, q, scale, value=-1.0).clamp_(max=0.0).neg_()
        if keep is not None:
            residual = torch.where(keep, residual, q)
    elif excluded is not None:
        residual = q.masked_fill(token_ids == excluded, 0.0)
    residual = torch.where(use_target.unsqueeze(-1), q, residual)
    offset = torch.zeros_like(start)
    if residual.shape[-1] == BLOCK:
        parts = residual.view(-1, _SUB, BLOCK // _SUB)
        sub, u = inverse_cdf(parts.sum(dim=-1, dtype=torch.float64), u)
        residual = parts.gather(1, sub.view(-1, 1, 1).expand(-1, 1, BLOCK // _SUB)).squeeze(1)
        offset = sub * (BLOCK // _SUB)
    token_in, _ = inverse_cdf(residual, u)
    return (start + offset + token_in).clamp_(min=0, max=vocab - 1)


def sample_rows(
    source: ProbRows | LogitRows, rows: torch.Tensor, uniform: torch.Tensor
) -> torch.Tensor:
    """Draw one token per row from the rows ``q`` themselves: a flat inverse CDF.

    Where no draft is involved there is no residual to build, and one prefix sum per row
    is cheaper than the hierarchy of :func:`sample_residual` (it draws the same token but
    where the two sums round differently, with probability of the order of float32's
    epsilon). Rows are taken in chunks, so the float64 prefix sums never hold more than a
    cache-sized block, whatever the batch.

    Parameters
    ----------
    source : ProbRows or LogitRows
        The rows (processed logits or probabilities).
    rows : torch.Tensor
        ``[batch]`` int64 the row of each draw.
    uniform : torch.Tensor
        ``[batch]`` float64 uniforms in ``[0, 1)``.

    Returns
    -------
    torch.Tensor
        ``[batch]`` int64 token ids in ``[0, vocab)`` (0 for a row without mass).

    Examples
    --------
    >>> import torch
    >>> q = ProbRows(torch.tensor([[0.5, 0.0, 0.5]]))
    >>> sample_rows(q, torch.tensor([0, 0]), torch.tensor([0.2, 0.7], dtype=torch.float64))
    tensor([0, 2])
    """
    vocab = (source.probs if isinstance(source, ProbRows) else source.logits).shape[-1]
    budget = _CPU_CHUNK_ELEMENTS if rows.device.type == "cpu" else _DEVICE_CHUNK_ELEMENTS
    step = max(1, budget // max(vocab, 1))
    if rows.shape[0] <= step:
        return inverse_cdf(source.select(rows).chunk(0, vocab), uniform)[0]
    drawn = [
        inverse_cdf(source.select(rows[a : a + step]).chunk(0, vocab), uniform[a : a + step])[0]
        for a in range(0, rows.shape[0], step)
    ]
    return torch.cat(drawn)
