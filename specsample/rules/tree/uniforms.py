"""The random numbers of a tree verification step, and the checks of where they come from.

A step of a sequence whose first draft sits at absolute position ``pos`` (the number of
tokens before it) reads, when counter-seeded, the stripe ``[pos * TREE_STRIDE, (pos + 1) *
TREE_STRIDE)`` of :attr:`~specsample.random.Stream.TREE_ACCEPT` for its child tests and the
counter ``pos`` of :attr:`~specsample.random.Stream.TREE_FINAL` for its final draw. A
sequence's position strictly increases from step to step (every step emits a token), so
no counter is ever read twice, whatever the tree bounds of each step.
"""

from __future__ import annotations

import torch

from specsample.random import Seeding, Stream, stripe
from specsample.rules.tree.structure import check_bound

TREE_STRIDE = 1 << 20
"""Child tests a tree step may read per position: ``max_depth * max_children <= TREE_STRIDE``."""


def tree_uniforms(
    seeding: Seeding,
    max_depth: int,
    max_children: int,
    device: torch.device,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """The uniforms of one tree verification step.

    Column ``level * max_children + j`` decides the test of the ``j``-th child of the node
    reached at depth ``level``; the last column, ``max_depth * max_children``, makes the
    final draw. Counter-seeded rows read the child tests from
    :attr:`~specsample.random.Stream.TREE_ACCEPT` at counter
    ``pos * TREE_STRIDE + level * max_children + j`` and the final draw from
    :attr:`~specsample.random.Stream.TREE_FINAL` at counter ``pos``, ``pos`` being the row's
    absolute position: a decoding loop whose positions advance by the tokens emitted never
    reuses a number (and shares none with the chain rules' streams). Rows that read a
    generator draw the final number first, then the child tests, as chain steps do.

    Parameters
    ----------
    seeding : Seeding
        Where each row's numbers come from (``seeding.batch`` rows).
    max_depth, max_children : int
        Depth bound and child-slot bound, ``max_depth * max_children <= TREE_STRIDE``.
    device : torch.device
        Where the uniforms live.
    positions : torch.Tensor, optional
        ``[batch]`` integer absolute position of each row's first draft (the number of
        tokens before it; default 0).

    Returns
    -------
    torch.Tensor
        ``[batch, max_depth * max_children + 1]`` float64 in ``[0, 1)``.

    Examples
    --------
    >>> import torch
    >>> cpu = torch.device("cpu")
    >>> u = tree_uniforms(Seeding.build(2, cpu, seeds=[4, 4]), 2, 3, cpu)
    >>> u.shape, bool(torch.equal(u[0], u[1]))
    (torch.Size([2, 7]), True)
    """
    if not isinstance(seeding, Seeding):
        raise TypeError(f"seeding must be a Seeding, got {type(seeding).__name__}")
    check_bound("max_depth", max_depth)
    check_bound("max_children", max_children)
    tests = max_depth * max_children
    if tests > TREE_STRIDE:
        raise ValueError(
            f"max_depth * max_children must be <= TREE_STRIDE ({TREE_STRIDE}), got "
            f"{max_depth} * {max_children}; pass tighter max_depth and max_children"
        )
    batch = seeding.batch
    accept = stripe(positions, batch, tests, TREE_STRIDE, device)
    final = stripe(positions, batch, 1, 1, device)
    drawn = seeding.draw(device, [(Stream.TREE_FINAL, final), (Stream.TREE_ACCEPT, accept)])
    return drawn.roll(-1, dims=1)
