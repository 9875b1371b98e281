"""The tree's structure: its bounds, its input checks, its child table and the walk down it.

Everything here is shared by the sampled rules and the greedy walk of
:mod:`specsample.rules.tree.verify`. Nothing synchronises with the device except
:func:`tree_bounds` on a device tensor, :func:`resolve_bounds` on a host ``parents`` (which
reads it) and :func:`strict_checks` (which is asked to).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from specsample.params.checks import check_bound, require_data, require_tensor


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


def _is_child(parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Which nodes are tree nodes, and which node is a child of which.

    ``parents`` is ``[rows, N]`` int64. Returns ``valid [rows, N]`` bool (node ``i >= 1``
    with ``0 <= parents[b, i] < i``) and ``is_child [rows, N, N]`` bool (entry ``[b, i, c]``:
    ``c`` is a child of ``i``).
    """
    n = parents.shape[1]
    node = torch.arange(n, device=parents.device)
    valid = (parents >= 0) & (parents < node) & (node >= 1)
    return valid, (parents.unsqueeze(1) == node.view(1, n, 1)) & valid.unsqueeze(1)


def tree_bounds(parents: torch.Tensor) -> tuple[int, int]:
    """Depth of the deepest node and largest number of children of any node.

    Nodes that are not children (parent ``-1``, or a parent not smaller than the node's
    index) count for neither. This reads the values of ``parents``: call it on a host
    tensor (on a device tensor it synchronises).

    Parameters
    ----------
    parents : torch.Tensor
        ``[batch, num_nodes]`` or ``[num_nodes]`` integer parent indices.

    Returns
    -------
    tuple of int
        ``(max_depth, max_children)``.

    Examples
    --------
    >>> import torch
    >>> tree_bounds(torch.tensor([-1, 0, 0, 1, 1, 2, -1]))
    (2, 2)
    """
    if not isinstance(parents, torch.Tensor):
        raise TypeError(f"parents must be a torch.Tensor, got {type(parents).__name__}")
    if parents.dim() == 1:
        parents = parents.unsqueeze(0)
    if parents.dim() != 2 or parents.dtype.is_floating_point or parents.dtype == torch.bool:
        raise TypeError(
            "parents must be an integer tensor of shape [batch, num_nodes] or [num_nodes], "
            f"got {parents.dtype} of shape {tuple(parents.shape)}"
        )
    parents = parents.to(torch.int64)
    batch, n = parents.shape
    if batch == 0 or n <= 1:
        return 0, 0
    valid, is_child = _is_child(parents)
    max_children = int(is_child.sum(dim=-1).max())
    depth = torch.zeros(batch, n, dtype=torch.int64, device=parents.device)
    rows = torch.arange(batch, device=parents.device)
    for i in range(1, n):
        above = depth[rows, parents[:, i].clamp(0, n - 1)] + 1
        depth[:, i] = torch.where(valid[:, i], above, -n)
    return max(int(depth.max()), 0), max_children


def check_tree(
    target_probs: object, draft_token_ids: object, parents: object
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Shape and dtype checks of a tree step's inputs (no synchronisation).

    Returns ``target_probs [batch, N, vocab]``, ``draft_token_ids [batch, N]`` and
    ``parents`` as ``[batch, N]``, or ``[1, N]`` for a topology shared by the batch.
    """
    target_probs = require_tensor("target_probs", target_probs)
    draft_token_ids = require_tensor("draft_token_ids", draft_token_ids)
    parents = require_tensor("parents", parents)
    if target_probs.dim() != 3:
        raise ValueError(
            "target_probs must have shape [batch, num_nodes, vocab], "
            f"got {tuple(target_probs.shape)}"
        )
    if not target_probs.dtype.is_floating_point:
        raise TypeError(f"target_probs must be a floating tensor, got {target_probs.dtype}")
    batch, n, vocab = target_probs.shape
    if n < 1 or vocab < 1:
        raise ValueError(
            f"target_probs needs at least one node and one token, got {tuple(target_probs.shape)}"
        )
    if draft_token_ids.dtype.is_floating_point or draft_token_ids.dtype == torch.bool:
        raise TypeError(f"draft_token_ids must be an integer tensor, got {draft_token_ids.dtype}")
    if draft_token_ids.shape != (batch, n):
        raise ValueError(
            f"draft_token_ids must have shape {(batch, n)}, got {tuple(draft_token_ids.shape)}"
        )
    if parents.dtype.is_floating_point or parents.dtype == torch.bool:
        raise TypeError(f"parents must be an integer tensor, got {parents.dtype}")
    if parents.shape == (n,):
        parents = parents.unsqueeze(0)
    elif parents.shape != (batch, n):
        raise ValueError(
            f"parents must have shape {(batch, n)} or {(n,)}, got {tuple(parents.shape)}"
        )
    if draft_token_ids.device != target_probs.device:
        raise ValueError(
            f"draft_token_ids is on {draft_token_ids.device} "
            f"but target_probs is on {target_probs.device}"
        )
    if parents.device not in (torch.device("cpu"), target_probs.device):
        raise ValueError(
            f"parents is on {parents.device}: give it on the CPU or on the device of "
            f"target_probs ({target_probs.device})"
        )
    return target_probs, draft_token_ids, parents


def check_draft_probs(draft_probs: object, target_probs: torch.Tensor) -> torch.Tensor:
    """``draft_probs``: a floating tensor of the shape and device of ``target_probs``.

    Examples
    --------
    >>> check_draft_probs(torch.zeros(1, 2, 3), torch.zeros(1, 2, 4))
    Traceback (most recent call last):
    ...
    ValueError: draft_probs must have the shape of target_probs (1, 2, 4), got (1, 2, 3)
    """
    draft_probs = require_tensor("draft_probs", draft_probs)
    if draft_probs.shape != target_probs.shape:
        raise ValueError(
            f"draft_probs must have the shape of target_probs {tuple(target_probs.shape)}, "
            f"got {tuple(draft_probs.shape)}"
        )
    if not draft_probs.dtype.is_floating_point:
        raise TypeError(f"draft_probs must be a floating tensor, got {draft_probs.dtype}")
    if draft_probs.device != target_probs.device:
        raise ValueError(
            f"draft_probs is on {draft_probs.device} but target_probs is on {target_probs.device}"
        )
    return draft_probs


def resolve_bounds(
    parents: torch.Tensor, max_depth: int | None, max_children: int | None
) -> tuple[int, int]:
    """Loop bounds: the given ones, else read from a host ``parents [rows, N]``, else ``N - 1``."""
    check_bound("max_depth", max_depth)
    check_bound("max_children", max_children)
    if max_depth is not None and max_children is not None:
        return max_depth, max_children
    n = parents.shape[1]
    if parents.device.type == "cpu":
        depth, children = tree_bounds(parents)
    else:
        depth, children = n - 1, n - 1
    return (
        depth if max_depth is None else max_depth,
        children if max_children is None else max_children,
    )


def strict_checks(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    parents: torch.Tensor,
    draft_probs: torch.Tensor | None,
) -> None:
    """Value checks of checked inputs (these synchronise with the device)."""
    require_data("target_probs", target_probs)
    check_tree_values(draft_token_ids, parents, target_probs.shape[2])
    for name, probs in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        if probs is not None and not bool((torch.isfinite(probs) & (probs >= 0)).all()):
            raise ValueError(f"{name} must be finite and non-negative (no NaN or inf)")


def check_tree_values(draft_token_ids: torch.Tensor, parents: torch.Tensor, vocab: int) -> None:
    """Value checks of the tree (synchronise): ``parents [rows, N]`` and the node tokens.

    Every node ``i >= 1`` has its parent in ``[-1, i)``, and every tree node's token lies in
    ``[0, vocab)`` (the root's and the padding's are not read).
    """
    n = parents.shape[1]
    node = torch.arange(n, device=parents.device)
    bad_parent = (parents[:, 1:] < -1) | (parents[:, 1:] >= node[1:])
    if bool(bad_parent.any()):
        raise ValueError("parents must satisfy -1 <= parents[b, i] < i for every node i >= 1")
    ids = draft_token_ids.to(parents.device)
    in_tree = (parents >= 0) & (node >= 1)
    if bool((in_tree & ((ids < 0) | (ids >= vocab))).any()):
        raise ValueError(f"draft_token_ids of tree nodes must lie in [0, {vocab})")


def reachable(num_nodes: int, max_depth: int, max_children: int) -> tuple[int, int]:
    """The levels and child slots a walk down trees of ``num_nodes`` nodes can use.

    The bounds, each at most ``num_nodes - 1`` (no node lies deeper, none has more
    children): the loops run over these, so a huge bound costs no work, while the layouts
    keep the bounds as given (the output's ``max_depth + 1`` columns, the uniform of child
    slot ``j`` at level ``l`` in column ``l * max_children + j``).

    Examples
    --------
    >>> reachable(5, 1, 2**20)
    (1, 4)
    """
    return min(max_depth, num_nodes - 1), min(max_children, num_nodes - 1)


def child_table(parents: torch.Tensor, batch: int, max_children: int) -> torch.Tensor:
    """``[batch, N, max_children]`` int64: the ``j``-th child (in index order) of each node, or -1.

    ``parents`` is ``[batch, N]`` or ``[1, N]`` int64; a shared topology is tabulated once and
    expanded.
    """
    rows, n = parents.shape
    node = torch.arange(n, device=parents.device)
    _, is_child = _is_child(parents)
    rank = is_child.to(torch.int64).cumsum(dim=-1) - 1
    slot = torch.where(is_child & (rank < max_children), rank, max_children)
    table = torch.full((rows, n, max_children + 1), -1, dtype=torch.int64, device=parents.device)
    table.scatter_(2, slot, torch.where(is_child, node, -1).expand(rows, n, n).contiguous())
    return table[:, :, :max_children].expand(batch, n, max_children)


@dataclass
class Walk:
    """The state of a walk down a batch of trees, one level at a time.

    Attributes
    ----------
    rows : torch.Tensor
        ``[batch]`` int64 ``arange``, to index per-row tensors.
    current : torch.Tensor
        ``[batch]`` int64: the node each row stands at.
    active : torch.Tensor
        ``[batch]`` bool: rows still descending.
    accepted : torch.Tensor
        ``[batch]`` int64: nodes accepted so far.
    path : torch.Tensor
        ``[batch, max_depth + 1]`` int64: the visited nodes (the root, then -1).
    tokens : torch.Tensor
        ``[batch, max_depth + 1]`` int64: their tokens (then -1).
    """

    rows: torch.Tensor
    current: torch.Tensor
    active: torch.Tensor
    accepted: torch.Tensor
    path: torch.Tensor
    tokens: torch.Tensor

    @staticmethod
    def start(batch: int, max_depth: int, device: torch.device) -> Walk:
        """Every row at its root, nothing accepted."""
        path = torch.full((batch, max_depth + 1), -1, dtype=torch.int64, device=device)
        path[:, 0] = 0
        return Walk(
            torch.arange(batch, device=device),
            torch.zeros(batch, dtype=torch.int64, device=device),
            torch.ones(batch, dtype=torch.bool, device=device),
            torch.zeros(batch, dtype=torch.int64, device=device),
            path,
            torch.full((batch, max_depth + 1), -1, dtype=torch.int64, device=device),
        )

    def descend(
        self, level: int, found: torch.Tensor, chosen: torch.Tensor, ids: torch.Tensor
    ) -> None:
        """Move the rows that ``found [batch]`` a child to ``chosen [batch]``; stop the others.

        ``ids [batch, N]`` int64 are the node tokens; ``level`` is the depth left.
        """
        self.active = self.active & found
        self.current = torch.where(self.active, chosen, self.current)
        self.accepted = self.accepted + self.active.to(torch.int64)
        self.path[:, level + 1] = torch.where(self.active, self.current, -1)
        self.tokens[:, level] = torch.where(self.active, ids[self.rows, self.current], -1)

    def finish(self, final: torch.Tensor) -> TreeVerifyResult:
        """The result, with ``final [batch]`` int64 emitted after the accepted tokens."""
        tokens = self.tokens.scatter(1, self.accepted.unsqueeze(-1), final.unsqueeze(-1))
        return TreeVerifyResult(self.path, tokens, self.accepted + 1)
