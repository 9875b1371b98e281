"""Keyed Gumbel noise: the randomness of ``method="gumbel"``, one number per row and token.

Gumbel-max sampling: with ``g_v`` independent standard Gumbel variables, ``argmax_v (z_v +
g_v)`` over the kept tokens is an exact sample of ``softmax(z)`` over them. Method
``"gumbel"`` keys the noise of a row by the request's seed and the row's absolute position,
so the token a request samples at a position is fixed by its seed, whatever the drafts,
their number, the batch or the thread count; a draft model drawing its proposals with the
same noise agrees with the target as often as no other coupling without communication can
(Daliri, Musco and Suresh, arXiv 2408.07978).

The definition, which every backend computes bit for bit:

* **row key** (32 bits): a counter-seeded request reads, for the token at absolute position
  ``t``, ``hash_bits(stream_key(seed, Stream.GUMBEL), t)`` (:func:`specsample.random.hash_bits`);
  any other request draws a 32-bit key ``r`` per step from its generator (or the shared one,
  :meth:`specsample.params.seeding.Seeding.unseeded`), and its ``j``-th row of the step reads
  ``hash_bits(r, j)``;
* **token bits**: ``h = mix32((mix32(v ^ key) + key) mod 2**32)`` for token ``v``
  (:func:`specsample.random.mix32`, the lowbias32 mixer);
* **noise**: ``u = (h + 0.5) * 2**-32`` in float64 (exact, in ``(0, 1)``), ``g = -log(-log(u))``
  in float64.

``g`` lies in ``(-3.2, 22.9)``: below :data:`GUMBEL_MAX`, so a kernel may skip, without
changing its result, every token whose ``z + GUMBEL_MAX`` is at most the best score found so
far. The grid of ``u`` moves a sampled token's probability by far less than float32 rounding of
the logits does.

Examples
--------
>>> import torch
>>> keys = row_keys(torch.tensor([7, 7]), torch.tensor([3, 4]))
>>> g = gumbel_noise(keys, 0, 5)
>>> g.shape, g.dtype, bool((g < GUMBEL_MAX).all()), bool(torch.equal(g[0], g[1]))
(torch.Size([2, 5]), torch.float64, True, False)
"""

from __future__ import annotations

import torch

from specsample.params.seeding import Seeding
from specsample.random import Stream, hash_bits, mix32

GUMBEL_MAX = 23.0
"""An upper bound of every noise value (the largest is ``-log(-log(1 - 2**-33))``, 22.87)."""

_MASK32 = 0xFFFFFFFF


def request_keys(
    seeding: Seeding, positions: torch.Tensor | None, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each request's key and first counter for one step.

    Parameters
    ----------
    seeding : Seeding
        Where each request takes its random numbers from.
    positions : torch.Tensor or None
        ``[batch]`` int64 absolute position of each request's first row (0 when ``None``).
    device : torch.device
        The batch's device.

    Returns
    -------
    tuple of torch.Tensor
        ``[batch]`` int64 keys in ``[0, 2**32)`` and ``[batch]`` int64 counters: a
        counter-seeded request's :attr:`~specsample.random.Stream.GUMBEL` key and position,
        any other request a key drawn from its generator and 0.

    Examples
    --------
    >>> cpu = torch.device("cpu")
    >>> seeding = Seeding.build(2, cpu, seeds=[3, 3])
    >>> keys, counters = request_keys(seeding, torch.tensor([5, 9]), cpu)
    >>> bool(keys[0] == keys[1]), counters.tolist()
    (True, [5, 9])
    """
    drawn = seeding.unseeded(1, device)[:, 0].mul(4294967296.0).to(torch.int64)
    counters = torch.zeros(seeding.batch, dtype=torch.int64, device=device)
    counted = seeding.counter_rows()
    if counted is None:
        return drawn, counters
    if positions is not None:
        counters = torch.where(counted, positions.to(device=device, dtype=torch.int64), 0)
    return torch.where(counted, seeding.key(Stream.GUMBEL), drawn), counters


def row_keys(keys: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """``[rows]`` int64 row keys in ``[0, 2**32)``: ``hash_bits(keys, counters)`` row by row.

    ``keys`` and ``counters`` are ``[rows]`` int64 (a request's key and its counter plus the
    row's index in the step).

    Examples
    --------
    >>> row_keys(torch.tensor([1, 1]), torch.tensor([0, 1])).tolist() != [0, 0]
    True
    """
    return hash_bits(keys, counters.unsqueeze(-1)).squeeze(-1)


def gumbel_bits(keys: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """``[rows, stop - start]`` int64 token bits ``h`` of tokens ``start..stop-1`` (see the
    module docstring) for ``[rows]`` int64 row keys."""
    tokens = torch.arange(start, stop, dtype=torch.int64, device=keys.device)
    key = keys.unsqueeze(-1)
    return mix32((mix32(tokens ^ key) + key) & _MASK32)


def gumbel_noise(keys: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """``[rows, stop - start]`` float64 Gumbel noise of tokens ``start..stop-1``.

    Parameters
    ----------
    keys : torch.Tensor
        ``[rows]`` int64 row keys (:func:`row_keys`).
    start, stop : int
        The tokens, ``0 <= start <= stop``.

    Returns
    -------
    torch.Tensor
        ``-log(-log(u))`` with ``u = (h + 0.5) * 2**-32``, ``h`` from :func:`gumbel_bits`.
    """
    u = gumbel_bits(keys, start, stop).to(torch.float64).add_(0.5).mul_(1.0 / 4294967296.0)
    return u.log_().neg_().log_().neg_()
