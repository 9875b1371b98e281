"""The random numbers of a tree verification step, and the checks of where they come from.

A step of a sequence whose first draft sits at absolute position ``pos`` (the number of
tokens before it) reads, when counter-seeded, the stripe ``[pos * TREE_STRIDE, (pos + 1) *
TREE_STRIDE)`` of :attr:`~specsample.random.Stream.TREE_ACCEPT` for its child tests and the
counter ``pos`` of :attr:`~specsample.random.Stream.TREE_FINAL` for its final draw
(:func:`tree_uniforms`); traversal verification reads the same stripe of
:attr:`~specsample.random.Stream.TRAVERSAL`, one number per node
(:func:`traversal_uniforms`). A sequence's position strictly increases from step to step
(every step emits a token), so no counter is ever read twice, whatever the tree bounds of
each step.

A step either draws its numbers from a :class:`~specsample.params.seeding.Seeding` at the rows'
positions (:func:`step_source` checks both) or takes the caller's (:func:`given_uniforms`).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specsample.params.checks import (
    check_bound,
    check_int,
    check_step_uniforms,
    check_uniform_values,
)
from specsample.params.seeding import (
    Seeding,
    check_position_values,
    check_seeding,
    positions_from,
    require_positions,
)
from specsample.random import Stream
from specsample.uniforms import stripe

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
    parts = [(Stream.TREE_ACCEPT, accept), (Stream.TREE_FINAL, final)]
    return seeding.draw(device, parts, first_last=True)


def traversal_uniforms(
    seeding: Seeding,
    num_nodes: int,
    device: torch.device,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """The uniforms of one traversal verification step.

    Column ``i >= 1`` decides the test of node ``i``; column 0 makes the final draw.
    Counter-seeded rows read :attr:`~specsample.random.Stream.TRAVERSAL` at counter
    ``pos * TREE_STRIDE + i``, ``pos`` being the row's absolute position; rows that read a
    generator draw all columns at once, the final draw first.

    Parameters
    ----------
    seeding : Seeding
        Where each row's numbers come from (``seeding.batch`` rows).
    num_nodes : int
        Nodes of the tree, the root included: ``1 <= num_nodes <= TREE_STRIDE``.
    device : torch.device
        Where the uniforms live.
    positions : torch.Tensor, optional
        ``[batch]`` integer absolute position of each row's first draft (default 0).

    Returns
    -------
    torch.Tensor
        ``[batch, num_nodes]`` float64 in ``[0, 1)``.

    Examples
    --------
    A seeded row reads counters of its position only: the same seed at another position
    gives other numbers.

    >>> cpu = torch.device("cpu")
    >>> seeding = Seeding.build(2, cpu, seeds=[4, 4])
    >>> u = traversal_uniforms(seeding, 3, cpu, torch.tensor([0, 1]))
    >>> tuple(u.shape), bool(torch.equal(u[0], u[1]))
    ((2, 3), False)
    """
    if not isinstance(seeding, Seeding):
        raise TypeError(f"seeding must be a Seeding, got {type(seeding).__name__}")
    check_int("num_nodes", num_nodes, 1, TREE_STRIDE)
    counters = stripe(positions, seeding.batch, num_nodes, TREE_STRIDE, device)
    return seeding.draw(device, [(Stream.TRAVERSAL, counters)])


def step_source(
    seeding: object,
    positions: torch.Tensor | Sequence[int] | None,
    batch: int,
    device: torch.device,
    strict: bool,
) -> tuple[Seeding, torch.Tensor | None]:
    """Where a step that draws its uniforms reads them: the seeding and the positions.

    ``seeding`` is checked against the batch (``None``: every row on torch's default
    generator) and ``positions`` validated as ``[batch]`` int64 on ``device`` (their values
    too with ``strict``, which synchronises); seeds need positions.

    Examples
    --------
    >>> source, at = step_source(None, [3], 1, torch.device("cpu"), False)
    >>> source.seeds is None, at.tolist()
    (True, [3])
    """
    source = check_seeding(seeding, batch, device)
    at = positions_from(positions, batch, device)
    require_positions(source, at)
    if strict:
        check_position_values(at)
    return source, at


def given_uniforms(
    uniforms: object,
    seeding: object,
    shape: tuple[int, int],
    layout: str,
    device: torch.device,
    strict: bool,
) -> torch.Tensor:
    """Caller-given uniforms: float64 of ``shape`` on ``device`` (values in strict mode).

    A step takes its uniforms or a ``seeding`` to draw them from, not both; ``layout`` says
    in the messages what the columns are.

    Examples
    --------
    >>> given_uniforms(torch.zeros(1, 2), None, (1, 3), "3 columns", torch.device("cpu"), False)
    Traceback (most recent call last):
    ...
    ValueError: uniforms must have shape (1, 3) (3 columns), got (1, 2)
    """
    if seeding is not None:
        raise ValueError("pass uniforms or a seeding (seeds/generators) to draw them, not both")
    checked = check_step_uniforms(uniforms, *shape, device, layout=layout)
    if strict:
        check_uniform_values(checked)
    return checked
