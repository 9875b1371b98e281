"""Token trees in the decoding loop: a static shape, its node layout, and how children are drawn.

A tree step drafts, per sequence, a tree whose root is the last committed token: the root
has ``branching[0]`` children, each of them ``branching[1]``, and so on, ``len(branching)``
levels deep. Nodes are numbered level by level (the root is node 0; a level's nodes are
ordered by parent, then by drawing order), so a parent always precedes its children, as
:func:`specsample.verify_tree` requires, and every level is a contiguous range of
nodes that the draft model scores in one forward. The target then scores every node in ONE
forward, each node attending to the committed tokens, its ancestors and itself (a tree
attention mask) at the position of its depth.

How the children of a node are drawn decides the exact rule (``drafting``, see
:func:`specsample.methods.tree_method`): ``"iid"`` draws them independently from the draft's
distribution (with replacement), ``"without_replacement"`` one after the other, each time
without the tokens drawn already, and ``"deterministic"`` takes the draft's ``c`` most
likely tokens (the only choice at temperature 0).

One tree runs from shape to layout: a :class:`TreeShape` (branching and drafting, checked
once) lays out as a :class:`TreeLayout`, whose :attr:`~TreeLayout.draft` is the
:class:`~specsample.params.DraftTree` that :func:`specsample.verify_tree` reads, and whose
depths and attention mask the forward reads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from specsample.methods import MAX_STEP_TREE_NODES, tree_draftings
from specsample.params import DraftTree
from specsample.random import inverse_cdf


class TreeShape(NamedTuple):
    """A static tree: children per node at each depth, and how they are drawn.

    Attributes
    ----------
    branching : tuple of int
        ``branching[d]`` children for every node of depth ``d`` (the root has depth 0).
    drafting : str
        One of :func:`specsample.methods.tree_draftings`.

    Examples
    --------
    >>> shape = TreeShape((2, 2, 1))
    >>> shape.nodes, shape.depth
    (10, 3)
    """

    branching: tuple[int, ...]
    drafting: str = "iid"

    @property
    def nodes(self) -> int:
        """Drafted nodes (the root excluded)."""
        total, width = 0, 1
        for children in self.branching:
            width *= children
            total += width
        return total

    @property
    def depth(self) -> int:
        """Levels below the root: the most drafts a sequence can accept in a step."""
        return len(self.branching)

    @staticmethod
    def build(branching: Sequence[int], drafting: str = "iid") -> TreeShape:
        """Validate ``branching`` and ``drafting``.

        Raises
        ------
        TypeError
            ``branching`` is not a sequence of int.
        ValueError
            An empty shape, a count below 1, more than
            :data:`~specsample.methods.MAX_STEP_TREE_NODES` nodes, or an
            unknown ``drafting``.

        Examples
        --------
        >>> TreeShape.build([3, 1], "without_replacement")
        TreeShape(branching=(3, 1), drafting='without_replacement')
        """
        if isinstance(branching, (str, bytes)) or not isinstance(branching, Sequence):
            raise TypeError(f"branching must be a sequence of int, got {type(branching).__name__}")
        counts = tuple(branching)
        if not counts:
            raise ValueError("branching must name at least one level")
        for count in counts:
            if isinstance(count, bool) or not isinstance(count, int):
                raise TypeError(f"branching must hold ints, got {type(count).__name__}")
            if count < 1:
                raise ValueError(f"branching counts must be at least 1, got {list(counts)}")
        if drafting not in tree_draftings():
            raise ValueError(f"drafting must be one of {tree_draftings()}, got {drafting!r}")
        shape = TreeShape(counts, drafting)
        if shape.nodes > MAX_STEP_TREE_NODES:
            raise ValueError(
                f"a tree of branching {list(counts)} has {shape.nodes} nodes, more than "
                f"{MAX_STEP_TREE_NODES}"
            )
        return shape

    @staticmethod
    def for_budget(budget: int, drafting: str = "iid") -> TreeShape:
        """The default shape of at most ``budget`` nodes: two branches from the root, each a
        chain as deep as the budget allows.

        On the shipped pair this gives the most tokens per target forward of the shapes
        of 14 to 16 nodes tried (wider trees find the accepted token more often at the
        first levels, but stop sooner).

        Examples
        --------
        >>> TreeShape.for_budget(16).branching, TreeShape.for_budget(5).branching
        ((2, 1, 1, 1, 1, 1, 1, 1), (2, 1))
        """
        if isinstance(budget, bool) or not isinstance(budget, int):
            raise TypeError(f"the tree budget must be an int, got {type(budget).__name__}")
        if not 2 <= budget <= MAX_STEP_TREE_NODES:
            raise ValueError(
                f"the tree budget must lie in [2, {MAX_STEP_TREE_NODES}], got {budget}"
            )
        return TreeShape.build([2] + [1] * ((budget - 2) // 2), drafting)


class TreeLayout(NamedTuple):
    """The node tensors of a :class:`TreeShape` (``N`` drafted nodes, ``N + 1`` with the root):
    the tree as the verifier reads it, and what the loop's forward needs besides.

    Attributes
    ----------
    draft : DraftTree
        The tree's draft layout for :func:`specsample.verify_tree`: ``[N + 1]`` int64
        parents (``-1`` for the root, :attr:`parents`), the shape's drafting and its loop
        bounds (its depth, and its widest branching).
    depth : torch.Tensor
        ``[N + 1]`` int64 (0 for the root).
    visible : torch.Tensor
        ``[N + 1, N + 1]`` bool: node ``i`` may attend to node ``j`` (its ancestors and
        itself).
    levels : tuple of (int, int)
        The node range ``[start, stop)`` of every depth ``1 .. D``.
    """

    draft: DraftTree
    depth: torch.Tensor
    visible: torch.Tensor
    levels: tuple[tuple[int, int], ...]

    @property
    def parents(self) -> torch.Tensor:
        """``[N + 1]`` int64 parent of each node, ``-1`` for the root."""
        return self.draft.parents

    @staticmethod
    def build(shape: TreeShape, device: torch.device) -> TreeLayout:
        """Lay out ``shape``'s nodes level by level.

        Examples
        --------
        >>> layout = TreeLayout.build(TreeShape((2, 1)), torch.device("cpu"))
        >>> layout.parents.tolist(), layout.levels
        ([-1, 0, 0, 1, 2], ((1, 3), (3, 5)))
        """
        parents, depth, levels = [-1], [0], []
        previous = [0]
        for level, children in enumerate(shape.branching, start=1):
            start = len(parents)
            for parent in previous:
                parents += [parent] * children
            depth += [level] * (len(parents) - start)
            levels.append((start, len(parents)))
            previous = list(range(start, len(parents)))
        visible = torch.eye(len(parents), dtype=torch.bool)
        for node in range(1, len(parents)):
            visible[node] |= visible[parents[node]]
        draft = DraftTree.build(
            torch.tensor(parents, device=device),
            shape.drafting,
            max_depth=shape.depth,
            max_children=max(shape.branching),
        )
        return TreeLayout(
            draft,
            torch.tensor(depth, device=device),
            visible.to(device),
            tuple(levels),
        )


def draw_children(
    drafting: str,
    logits: torch.Tensor,
    probs: torch.Tensor | None,
    children: int,
    uniforms: torch.Tensor | None,
) -> torch.Tensor:
    """The children of every node of a level: ``[batch, nodes * children]`` int64 tokens.

    Parameters
    ----------
    drafting : str
        One of :func:`specsample.methods.tree_draftings`.
    logits : torch.Tensor
        ``[batch, nodes, vocab]`` the draft's logits after each node.
    probs : torch.Tensor or None
        ``[batch, nodes, vocab]`` their processed distributions (``None`` at temperature 0,
        where children are the ``children`` most likely tokens).
    children : int
        Children per node.
    uniforms : torch.Tensor or None
        ``[batch, nodes * children]`` float64, one per child (unused by deterministic
        drafting).

    Examples
    --------
    >>> logits = torch.tensor([[[0.0, 2.0, 1.0]]])
    >>> draw_children("deterministic", logits, None, 2, None).tolist()
    [[1, 2]]
    """
    batch, nodes, vocab = logits.shape
    if probs is None or uniforms is None or drafting == "deterministic":
        scores = logits if probs is None else probs
        return scores.topk(min(children, vocab), dim=-1).indices.reshape(batch, -1)
    u = uniforms.view(batch, nodes, children)
    if drafting == "iid":
        rows = probs.unsqueeze(2).expand(batch, nodes, children, vocab).reshape(-1, vocab)
        return inverse_cdf(rows, u.reshape(-1))[0].view(batch, -1)
    weights = probs.reshape(-1, vocab).clone()
    drawn = []
    for j in range(children):
        token = inverse_cdf(weights, u[:, :, j].reshape(-1))[0]
        weights.scatter_(1, token.unsqueeze(1), 0.0)
        drawn.append(token.view(batch, nodes))
    return torch.stack(drawn, dim=2).view(batch, -1)
