"""The walk of traversal verification: the post-order traversal of a batch of token trees.

The rule and why it is exact are in :mod:`specsample.rules.tree.traversal`; here is how
the traversal is carried out. It is vectorised over the batch. For a topology shared by the
batch and given on the host (``parents`` of shape ``[N]``, the usual static tree), the walk
is the same for every row and is unrolled on the host, two short steps per node
(:func:`_walk_shared`); otherwise (per-row topologies, or ``parents`` on an accelerator) a
loop of ``2 M + 1`` steps, ``M`` the number of nodes the bounds allow (at most ``N - 1``),
moves every row through its own tree: each step it enters a child, or tests its node and
moves back to the parent, or idles once done (:func:`_walk_rows`). Every branch is a
:func:`torch.where`, so nothing synchronises with the device.

Without uniforms the walk does not sample: every test below the root fails while the
probability of each outcome is accumulated, which gives the exact expected tokens of a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specsample.rules.tree.structure import child_table, reachable
from specsample.rules.tree.verify import normalized, without


@dataclass(frozen=True)
class TraversalTree:
    """Checked inputs of a traversal step.

    ``target`` and ``draft`` are ``[batch, N, vocab]``, ``ids [batch, N]`` int64,
    ``parents [batch, N]`` or ``[1, N]`` (shared), on the CPU or the device; ``remove``:
    the draft row loses each rejected child's token (children drawn without replacement).
    """

    target: torch.Tensor
    ids: torch.Tensor
    parents: torch.Tensor
    draft: torch.Tensor
    remove: bool
    max_depth: int
    max_children: int

    @property
    def work(self) -> torch.dtype:
        """float64 for float64 inputs, else float32."""
        return torch.float64 if self.target.dtype == torch.float64 else torch.float32


def _child_weight(w: torch.Tensor, q_x: torch.Tensor, p_x: torch.Tensor) -> torch.Tensor:
    """``min(1, w q(x) / p(x))`` (float64 ``[batch]``): 1 when ``p(x) = 0 < w q(x)``, else 0."""
    ratio = (w * q_x) / torch.where(p_x > 0, p_x, 1.0)
    return torch.where(p_x > 0, ratio.clamp(max=1.0), (w * q_x > 0).to(torch.float64))


def _deleted(
    w: torch.Tensor, q: torch.Tensor, p: torch.Tensor, token: torch.Tensor, remove: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A node's weight ``[batch]`` and rows ``[batch, vocab]`` after a child is deleted.

    ``w <- Z / (Z + 1 - w)`` (0 for ``0 / 0``) with ``Z`` the mass of
    ``max(w q - p, 0)``, ``q <- normalize(max(w q - p, 0))`` (``q`` itself when ``Z = 0``),
    and with ``remove`` ``p <- normalize(p without token)`` (zeros when empty). The root's
    weight stays 1, which the callers apply.
    """
    residual = (w.to(q.dtype).unsqueeze(-1) * q - p).clamp_(min=0.0)
    mass = residual.sum(dim=-1, dtype=torch.float64)
    denominator = mass + 1.0 - w
    safe = torch.where(denominator > 0, denominator, 1.0)
    weight = torch.where(denominator > 0, mass / safe, 0.0)
    if remove:
        p = normalized(without(p, token), torch.zeros_like(p))
    return weight, normalized(residual, q), p


def _valid_children(tree: TraversalTree) -> torch.Tensor:
    """``[batch, N, width]`` int64: each node's children with a valid token, in order.

    The first ``max_children`` children of each node (as :func:`child_table`) without those
    whose token lies outside ``[0, vocab)``, moved to the front; then -1. ``width`` is the
    number of child slots a node can use (:func:`reachable`: at most ``N - 1``).
    """
    ids, (batch, n, vocab) = tree.ids, tree.target.shape
    width = reachable(n, tree.max_depth, tree.max_children)[1]
    parents = tree.parents.to(device=ids.device, dtype=torch.int64)
    table = child_table(parents, batch, width)
    rows = torch.arange(batch, device=ids.device).view(batch, 1, 1)
    token = ids[rows, table.clamp(min=0)]
    valid = (table >= 0) & (token >= 0) & (token < vocab)
    rank = torch.where(valid, valid.to(torch.int64).cumsum(dim=-1) - 1, width)
    compact = torch.full((*table.shape[:2], width + 1), -1, dtype=torch.int64, device=ids.device)
    compact.scatter_(2, rank, torch.where(valid, table, -1))
    return compact[:, :, :width]


def _step_bound(num_nodes: int, max_depth: int, max_children: int) -> int:
    """``2 M + 1`` loop steps, ``M`` the most nodes a tree within the bounds can have."""
    reachable, level = 0, 1
    for _ in range(max_depth):
        level *= max_children
        reachable += level
        if reachable >= num_nodes - 1:
            break
    return 2 * min(reachable, num_nodes - 1) + 1


Walked = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""``path [batch, max_depth + 1]`` int64 (the accepted path from the root, then -1),
``depth [batch]`` int64 (nodes accepted) and, with uniforms, the ``[batch, vocab]`` row of
the final draw; without, ``[batch]`` float64 the expected tokens emitted."""


@dataclass
class _Stack:
    """The states of the nodes on each row's current path, indexed by depth.

    ``node`` and ``slot`` (the next child slot to enter) ``[batch, levels]`` int64, ``w``
    ``[batch, levels]`` float64, ``q`` and ``p`` ``[batch, levels, vocab]``.
    """

    node: torch.Tensor
    slot: torch.Tensor
    w: torch.Tensor
    q: torch.Tensor
    p: torch.Tensor

    @staticmethod
    def empty(
        batch: int, levels: int, vocab: int, work: torch.dtype, device: torch.device
    ) -> _Stack:
        """Zeros (weights: ones) for ``levels`` depths."""
        index = torch.zeros(batch, levels, dtype=torch.int64, device=device)
        rows = torch.zeros(batch, levels, vocab, dtype=work, device=device)
        ones = torch.ones(batch, levels, dtype=torch.float64, device=device)
        return _Stack(index, index.clone(), ones, rows, rows.clone())

    def push(self, rows: torch.Tensor, depth: torch.Tensor, *state: torch.Tensor) -> None:
        """Write ``(node, slot, w, q, p)`` at each row's ``depth``."""
        for stack, value in zip((self.node, self.slot, self.w, self.q, self.p), state, strict=True):
            stack[rows, depth] = value


def _walk_rows(tree: TraversalTree, uniforms: torch.Tensor | None) -> Walked:
    """The traversal of per-row topologies: a loop of steps, each row at its own node.

    Each step, a row enters its current node's next child, or tests the node and (when it
    fails) moves back to the parent, or idles once done; the states of the ancestors of the
    current node live on a :class:`_Stack` indexed by depth. Without uniforms every test
    below the root fails while the probability of each outcome is accumulated.
    """
    target, draft, ids, work = tree.target, tree.draft, tree.ids, tree.work
    batch, n, vocab = target.shape
    device = target.device
    table = _valid_children(tree)
    rows = torch.arange(batch, device=device)
    width, max_depth = table.shape[-1], tree.max_depth
    stack = _Stack.empty(batch, max_depth + 1, vocab, work, device)
    node = torch.zeros(batch, dtype=torch.int64, device=device)
    slot, depth = node.clone(), node.clone()
    w = torch.ones(batch, dtype=torch.float64, device=device)
    q, p = target[:, 0].to(work), draft[:, 0].to(work)
    active = torch.ones(batch, dtype=torch.bool, device=device)
    survive, expected = w.clone(), torch.zeros_like(w)
    for _ in range(_step_bound(n, max_depth, width)):
        child = torch.full_like(node, -1)
        if width:
            child = torch.where(slot < width, table[rows, node, slot.clamp(max=width - 1)], -1)
        descend = active & (child >= 0) & (depth < max_depth)
        tested = active & ~descend
        at_root = depth == 0
        if uniforms is None:
            chance = torch.where(at_root, 1.0, w)
            emitted = (depth + 1).to(torch.float64)
            expected = torch.where(tested, expected + survive * chance * emitted, expected)
            survive = torch.where(tested, survive * (1.0 - chance), survive)
            accept = tested & at_root
        else:
            accept = tested & (at_root | (uniforms[rows, node] < w))
        reject = tested & ~accept

        # Push the current state: harmless for the rows that do not descend, as only the
        # entries below a row's depth are ever read back.
        stack.push(rows, depth, node, slot + 1, w, q, p)

        entered = child.clamp(min=0)
        token = ids[rows, entered].clamp(0, vocab - 1).unsqueeze(-1)
        q_x = q.gather(1, token).squeeze(-1).to(torch.float64)
        p_x = p.gather(1, token).squeeze(-1).to(torch.float64)
        w_child = _child_weight(w, q_x, p_x)

        up = (depth - 1).clamp(min=0)
        own = ids[rows, node].clamp(0, vocab - 1)
        w_up, q_up, p_up = _deleted(
            stack.w[rows, up], stack.q[rows, up], stack.p[rows, up], own, tree.remove
        )
        w_up = torch.where(up == 0, 1.0, w_up)

        into, back = descend.unsqueeze(-1), reject.unsqueeze(-1)
        q = torch.where(into, target[rows, entered].to(work), torch.where(back, q_up, q))
        p = torch.where(into, draft[rows, entered].to(work), torch.where(back, p_up, p))
        w = torch.where(descend, w_child, torch.where(reject, w_up, w))
        node = torch.where(descend, child, torch.where(reject, stack.node[rows, up], node))
        slot = torch.where(descend, 0, torch.where(reject, stack.slot[rows, up], slot))
        depth = torch.where(descend, depth + 1, torch.where(reject, up, depth))
        active = active & ~accept
    stack.node[rows, depth] = node
    column = torch.arange(max_depth + 1, device=device)
    path = torch.where(column <= depth.unsqueeze(-1), stack.node, -1)
    return path, depth, expected if uniforms is None else q


def _events(parents: list[int], max_depth: int, max_children: int) -> list[tuple[bool, int, int]]:
    """The walk of a shared topology: ``(entering, node, depth)``, in order.

    Depth first from the root, children in index order (the first ``max_children`` of each
    node, none below ``max_depth``): each node is entered, its subtree walked, then it is
    left (``entering=False``), which is when it is tested.
    """
    kids: list[list[int]] = [[] for _ in parents]
    for i in range(1, len(parents)):
        if 0 <= parents[i] < i and len(kids[parents[i]]) < max_children:
            kids[parents[i]].append(i)
    events: list[tuple[bool, int, int]] = []
    stack = [(0, 0, iter(kids[0]))]
    while stack:
        node, depth, rest = stack[-1]
        child = next(rest, None) if depth < max_depth else None
        if child is None:
            stack.pop()
            if node:
                events.append((False, node, depth))
        else:
            events.append((True, child, depth + 1))
            stack.append((child, depth + 1, iter(kids[child])))
    return events


def _walk_shared(tree: TraversalTree, uniforms: torch.Tensor | None) -> Walked:
    """The traversal of a topology shared by the batch (``parents [1, N]`` on the host).

    The walk is the same for every row, so it is unrolled on the host, node after node;
    rows differ only in which nodes are present (a token outside the vocabulary removes a
    node and its subtree) and in the decisions. The state of the node at each depth of the
    current path is a plain tensor.
    """
    target, draft, ids, work = tree.target, tree.draft, tree.ids, tree.work
    batch, n, vocab = target.shape
    device = target.device
    parents = tree.parents[0].tolist()
    levels = tree.max_depth + 1
    token = ids.clamp(0, vocab - 1)
    valid = (ids >= 0) & (ids < vocab)
    weight = [torch.ones(batch, dtype=torch.float64, device=device)] * levels
    q = [target[:, 0].to(work)] * levels
    p = [draft[:, 0].to(work)] * levels
    present = [torch.ones(batch, dtype=torch.bool, device=device)] * n
    active = torch.ones(batch, dtype=torch.bool, device=device)
    final = torch.zeros(batch, dtype=torch.int64, device=device)
    final_q = q[0]
    survive = torch.ones(batch, dtype=torch.float64, device=device)
    expected = torch.zeros(batch, dtype=torch.float64, device=device)
    paths = [[0] + [-1] * (levels - 1) for _ in range(n)]
    for entering, node, depth in _events(parents, tree.max_depth, tree.max_children):
        above = depth - 1
        if entering:
            x = token[:, node].unsqueeze(-1)
            q_x = q[above].gather(1, x).squeeze(-1).to(torch.float64)
            p_x = p[above].gather(1, x).squeeze(-1).to(torch.float64)
            weight[depth] = _child_weight(weight[above], q_x, p_x)
            q[depth], p[depth] = target[:, node].to(work), draft[:, node].to(work)
            present[node] = present[parents[node]] & valid[:, node]
            paths[node] = [*paths[parents[node]][:depth], node, *paths[node][depth + 1 :]]
            continue
        testing = active & present[node]
        if uniforms is None:
            emitted = float(depth + 1)
            expected = torch.where(testing, expected + survive * weight[depth] * emitted, expected)
            survive = torch.where(testing, survive * (1.0 - weight[depth]), survive)
            reject = testing
        else:
            accept = testing & (uniforms[:, node] < weight[depth])
            final = torch.where(accept, node, final)
            final_q = torch.where(accept.unsqueeze(-1), q[depth], final_q)
            active = active & ~accept
            reject = testing & ~accept
        w_up, q_up, p_up = _deleted(weight[above], q[above], p[above], token[:, node], tree.remove)
        if above == 0:
            w_up = torch.ones_like(w_up)
        back = reject.unsqueeze(-1)
        weight[above] = torch.where(reject, w_up, weight[above])
        q[above] = torch.where(back, q_up, q[above])
        p[above] = torch.where(back, p_up, p[above])
    table = torch.tensor(paths, dtype=torch.int64).to(device)
    path = table[final]
    accepted = (path >= 0).sum(dim=-1) - 1
    if uniforms is None:
        return path, accepted, expected + survive
    return path, accepted, torch.where(active.unsqueeze(-1), q[0], final_q)


def traverse(tree: TraversalTree, uniforms: torch.Tensor | None) -> Walked:
    """The walk for ``tree``: unrolled on the host for a host topology shared by the batch."""
    if tree.parents.shape[0] == 1 and tree.parents.device.type == "cpu":
        return _walk_shared(tree, uniforms)
    return _walk_rows(tree, uniforms)
