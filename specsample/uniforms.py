"""The uniforms of one chain or block step: which numbers of :mod:`specsample.random` a
step reads, and in which order.

A step of ``k`` drafts reads ``k + 1`` uniforms per row: ``k`` accept tests and a final
draw. Counter-seeded rows read them in the stripe of the row's position
(:func:`stripe`), the accept tests from :attr:`~specsample.random.Stream.ACCEPT` and the
final draw from :attr:`~specsample.random.Stream.FINAL`; rows that read a generator draw the
final number first. :func:`step_uniforms` gives them in the one order every rule and backend
reads: the accept tests, then the final draw.
"""

from __future__ import annotations

import torch

from specsample.params.seeding import Seeding
from specsample.random import STEP_STRIDE, Stream, counter_uniform


def stripe(
    positions: torch.Tensor | None, batch: int, n: int, stride: int, device: torch.device
) -> torch.Tensor:
    """``[batch, n]`` counters ``position * stride + j``: the stripe of a step at ``position``.

    Examples
    --------
    >>> stripe(torch.tensor([0, 2]), 2, 3, 256, torch.device("cpu")).tolist()
    [[0, 1, 2], [512, 513, 514]]
    """
    if n > stride:
        raise ValueError(f"a step may read at most {stride} counters per stream, got {n}")
    start = torch.zeros(batch, dtype=torch.int64, device=device)
    if positions is not None:
        start = positions.to(device=device, dtype=torch.int64)
    return start.unsqueeze(-1) * stride + torch.arange(n, device=device)


def step_uniforms(
    seeding: Seeding, k: int, device: torch.device, positions: torch.Tensor | None = None
) -> torch.Tensor:
    """The uniforms of one chain or block step, in the order a rule reads them: the ``k``
    accept tests, then the final draw.

    Counter-seeded rows read the accept tests from :attr:`Stream.ACCEPT` and the final draw
    from :attr:`Stream.FINAL`, each in the stripe of the row's position (see
    :mod:`specsample.random`), so a loop never reuses a number: not even one that only
    influenced a decision indirectly, as every ``eta_i`` does in block verification. Rows
    that read a generator draw the final number first, then the accept tests: a row's first
    numbers do not depend on how wide the batch is, and a row with a generator of its own
    advances it by as much at every step (:meth:`Seeding.unseeded`), so a request verified
    alone or beside requests with more drafts reads the same numbers, step after step.

    Parameters
    ----------
    seeding : Seeding
        Where each row's numbers come from.
    k : int
        Drafts per row (``k < STEP_STRIDE``).
    device : torch.device
        Where the uniforms live.
    positions : torch.Tensor, optional
        ``[batch]`` int64 absolute position of each row's first draft (default 0).

    Returns
    -------
    torch.Tensor
        ``[batch, k + 1]`` float64 in ``[0, 1)``.

    Examples
    --------
    >>> import torch
    >>> cpu = torch.device("cpu")
    >>> u = step_uniforms(Seeding.build(2, cpu, seeds=[1, 1]), 3, cpu)
    >>> u.shape, bool(torch.equal(u[0], u[1]))
    (torch.Size([2, 4]), True)
    """
    if not 0 <= k < STEP_STRIDE:
        raise ValueError(f"k must lie in [0, {STEP_STRIDE}), got {k}")
    batch = seeding.batch
    if seeding.seeds is None:  # no counter-seeded row: no counters to build
        return seeding.unseeded(k + 1, device, first_last=True)
    final = stripe(positions, batch, 1, 1, device)
    if torch.compiler.is_compiling():
        return _in_one_width(seeding, seeding.seeds, final, k, device)
    accept = stripe(positions, batch, k, STEP_STRIDE, device)
    parts = [(Stream.ACCEPT, accept), (Stream.FINAL, final)]
    return seeding.draw(device, parts, first_last=True)


def _in_one_width(
    seeding: Seeding, seeds: torch.Tensor, final: torch.Tensor, k: int, device: torch.device
) -> torch.Tensor:
    """:func:`step_uniforms` with some row counter-seeded (by ``seeds``), without a tensor
    ``k`` columns wide.

    :func:`torch.compile` specialises a size of 1, so a graph holding a ``[batch, k]``
    tensor serves either ``k = 1`` or ``k >= 2``, never both. The accept tests are hashed
    over ``k + 1`` columns (column ``k`` hashing the counter of the last test again), and
    column ``k`` of the counter-seeded rows then takes the final draw: the same numbers.
    ``final`` is the ``[batch, 1]`` counter of the final draw.
    """
    cols = torch.arange(k + 1, device=device)
    accept = final * STEP_STRIDE + cols.clamp(max=max(k - 1, 0))
    drawn = seeding.draw(device, [(Stream.ACCEPT, accept)], first_last=True)
    last = counter_uniform(seeds, final, Stream.FINAL, key=seeding.key(Stream.FINAL))
    at_final = cols == k
    counted = seeding.counter_rows()
    if counted is not None:
        at_final = at_final & counted.unsqueeze(-1)
    return torch.where(at_final, last, drawn)
