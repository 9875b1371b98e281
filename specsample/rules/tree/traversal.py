"""Traversal verification of a token tree (Weng, Hu et al., NeurIPS 2025, arXiv 2505.12398).

The tree is verified leaf to root, in post-order, with sequence-level weights: a node is
tested against the probability that block verification would give its whole path, and a
rejected node is deleted, its parent's rows replaced by residuals, before the next node is
tried. A path that top-down verification discards with a rejected ancestor can then still
be accepted through a sibling of that ancestor, and on a chain the rule is block
verification (:mod:`specsample.rules.block`). Notation as in the rest of the library: ``q``
is the target distribution, ``p`` the draft distribution (the paper's letters are the other
way round).

The rule. Every node ``v`` holds a weight ``w_v``, a target row ``q_v`` and a draft row
``p_v`` (initially ``target_probs[v]`` and ``draft_probs[v]``); the root's weight is 1. The
walk is a depth-first traversal that tries the children of a node in increasing index
order:

* entering a child ``c`` of ``v`` with token ``x`` sets
  ``w_c = min(1, w_v q_v(x) / p_v(x))`` from the parent's *current* weight and rows (block
  verification's weight recursion along the path);
* a node all of whose children are deleted (or that has none) is tested: it is accepted
  with probability ``w_v`` (one uniform per node), the walk stops, and the path from the
  root to ``v`` is emitted followed by one token drawn from the current ``q_v``; the root,
  reached last, is always accepted;
* a rejected node ``c`` is deleted and its parent ``v`` updated with the residual mass
  ``Z = sum_y max(w_v q_v(y) - p_v(y), 0)``: ``q_v <- normalize(max(w_v q_v - p_v, 0))``
  and ``w_v <- Z / (Z + 1 - w_v)`` (block verification's ``h``; the root keeps weight 1).
  For children drawn without replacement, ``p_v <- normalize(p_v with x removed)`` as
  well, the law of the next sibling (the same update as recursive rejection sampling).

Why it is exact. Augment ``v``'s target with a symbol "reject ``v``" of mass ``1 - w_v``:
the tokens get ``w_v q_v``. By induction over the subtree, the traversal of ``v``'s subtree
(over the drafting of ``v``'s descendants and the uniforms) is rejected with probability
exactly ``1 - w_v`` and otherwise emits a stream whose law is ``w_v`` times the target's law
continued from ``q_v``. A child ``x ~ p_v`` whose subtree is
then accepted with probability ``w_c = min(1, w_v q_v(x) / p_v(x))`` is the accept test of
speculative sampling of the augmented target, and the update of ``(w_v, q_v)`` after a
rejection is its residual, ``normalize(max(augmented - p_v, 0))``. The siblings are therefore
tried as in multi-round speculative sampling (i.i.d. children: the next sibling is a fresh
draw from ``p_v``) or in recursive rejection sampling (children drawn without replacement,
with the draft row's update), both exact, and when every child is deleted the node's test
draws from the residual augmented target. At the root, ``w = 1``: the emitted stream
follows the target exactly. The tests of :mod:`tests.test_traversal` check this by exact
enumeration.

Drafting modes. The rule is exact for ``drafting="iid"`` and, with the draft row update
above, for ``"without_replacement"``. It is refused for
``"deterministic"`` children (top-k, n-gram, ...): its weights treat each child as a sample
from ``draft_probs``, which such children are not, and the output is badly biased;
:func:`~specsample.rules.tree.tree_verify` with ``drafting="deterministic"`` (the one-hot
rule) is the exact choice there. Without replacement, the traversal with the i.i.d. update
(``p_v`` unchanged) would be biased too, which is why the drafting mode is required.

Edge cases follow :func:`~specsample.rules.tree.tree_verify`: padding nodes and children
whose token lies outside ``[0, vocab)`` are skipped with their subtrees, ``max_depth`` and
``max_children`` truncate the tree (still exact), a residual without mass falls back to the
current target row, a weight ``0 / 0`` (``w_v = 1`` and ``Z = 0``, a probability-zero event)
becomes 0 below the root, and no NaN is ever produced.

Randomness. Node ``i`` reads uniform column ``i`` for its test (each node is tested at most
once) and column 0 makes the final draw, so a step reads ``[batch, N]`` uniforms
(:func:`traversal_uniforms`). Counter-seeded rows read
:attr:`~specsample.random.Stream.TRAVERSAL` at counter ``pos * TREE_STRIDE + i`` for the
row's absolute position ``pos``: a decoding loop whose positions advance by the tokens
emitted never reads a counter twice.

Work. The traversal is vectorised over the batch. For a topology shared by the batch and
given on the host (``parents`` of shape ``[N]``, the usual static tree), the walk is the same
for every row and is unrolled on the host, two short steps per node; otherwise (per-row
topologies, or ``parents`` on an accelerator) a loop of ``2 M + 1`` steps, ``M`` the number
of nodes the bounds allow (at most ``N - 1``), moves every row through its own tree: each
step it enters a child, or tests its node and moves back to the parent, or idles once done.
Every branch is a :func:`torch.where`, so nothing synchronises with the device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from specsample.checks import check_flag
from specsample.random import Seeding, Stream, inverse_cdf, stripe
from specsample.rules.tree.structure import (
    check_tree,
    child_table,
    resolve_bounds,
    strict_checks,
)
from specsample.rules.tree.uniforms import TREE_STRIDE
from specsample.rules.tree.verify import (
    TREE_DRAFTING,
    Drafting,
    _normalized,
    _without,
    check_draft_probs,
    check_given_uniforms,
)
from specsample.seeding import check_position_values, positions_from, seeding_from
from specsample.shared import TreeVerifyResult

TRAVERSAL_DRAFTING: tuple[Drafting, ...] = ("iid", "without_replacement")
"""Drafting modes traversal verification is exact for."""

_DETERMINISTIC = (
    "traversal verification weighs every child by q(x) / p(x), as a sample from draft_probs, "
    "which deterministic children (top-k, n-gram, ...) are not: the output would be badly "
    "biased; verify them with tree_verify(drafting='deterministic'), the one-hot rule"
)


def check_traversal_drafting(drafting: object) -> Drafting:
    """``drafting`` if traversal verification is exact for it, else the reason it is not.

    Parameters
    ----------
    drafting : str
        How the children were drafted: one of
        :data:`~specsample.rules.tree.TREE_DRAFTING`.

    Returns
    -------
    str
        ``drafting``, one of :data:`TRAVERSAL_DRAFTING`.

    Raises
    ------
    TypeError
        ``drafting`` is not a string.
    ValueError
        An unknown mode, or ``"deterministic"`` (the message says why).

    Examples
    --------
    >>> check_traversal_drafting("iid")
    'iid'
    >>> check_traversal_drafting("deterministic")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: drafting='deterministic' is refused: traversal verification weighs every ...
    """
    if not isinstance(drafting, str):
        raise TypeError(
            f"drafting must be a str, one of {TRAVERSAL_DRAFTING}, got {type(drafting).__name__}"
        )
    if drafting not in TREE_DRAFTING:
        raise ValueError(f"drafting must be one of {TRAVERSAL_DRAFTING}, got {drafting!r}")
    if drafting not in TRAVERSAL_DRAFTING:
        raise ValueError(f"drafting={drafting!r} is refused: {_DETERMINISTIC}")
    return "iid" if drafting == "iid" else "without_replacement"


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
    >>> import torch
    >>> cpu = torch.device("cpu")
    >>> u = traversal_uniforms(Seeding.build(2, cpu, seeds=[4, 4]), 5, cpu)
    >>> u.shape, bool(torch.equal(u[0], u[1]))
    (torch.Size([2, 5]), True)
    """
    if not isinstance(seeding, Seeding):
        raise TypeError(f"seeding must be a Seeding, got {type(seeding).__name__}")
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int):
        raise TypeError(f"num_nodes must be an int, got {type(num_nodes).__name__}")
    if not 1 <= num_nodes <= TREE_STRIDE:
        raise ValueError(f"num_nodes must lie in [1, TREE_STRIDE = {TREE_STRIDE}], got {num_nodes}")
    counters = stripe(positions, seeding.batch, num_nodes, TREE_STRIDE, device)
    return seeding.draw(device, [(Stream.TRAVERSAL, counters)])


def _step_uniforms(
    uniforms: object,
    target_probs: torch.Tensor,
    *,
    generator: torch.Generator | None,
    seeds: torch.Tensor | Sequence[int | None] | None,
    generators: Mapping[int, torch.Generator] | None,
    positions: torch.Tensor | Sequence[int] | None,
    strict: bool,
) -> torch.Tensor:
    """The given ``uniforms`` checked, or the step's own drawn: ``[batch, N]`` float64."""
    batch, n, _ = target_probs.shape
    device = target_probs.device
    if uniforms is None:
        seeding = seeding_from(
            batch, device, seeds=seeds, generators=generators, generator=generator
        )
        at = positions_from(positions, batch, device)
        if strict:
            check_position_values(at)
        if n > TREE_STRIDE:
            raise ValueError(
                f"target_probs has {n} nodes; drawn uniforms allow at most TREE_STRIDE = "
                f"{TREE_STRIDE} per step (pass uniforms, or a smaller tree)"
            )
        return traversal_uniforms(seeding, n, device, at)
    if seeds is not None or generators is not None:
        raise ValueError("pass uniforms or seeds/generators, not both")
    return check_given_uniforms(uniforms, (batch, n), "one column per node", device, strict)


@dataclass(frozen=True)
class _Tree:
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
        p = _normalized(_without(p, token), torch.zeros_like(p))
    return weight, _normalized(residual, q), p


def _valid_children(tree: _Tree) -> torch.Tensor:
    """``[batch, N, max_children]`` int64: each node's children with a valid token, in order.

    The first ``max_children`` children of each node (as :func:`child_table`) without those
    whose token lies outside ``[0, vocab)``, moved to the front; then -1.
    """
    ids, vocab, width = tree.ids, tree.target.shape[2], tree.max_children
    batch = ids.shape[0]
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


_Walked = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
"""``path [batch, max_depth + 1]`` int64 (the accepted path from the root, then -1),
``depth [batch]`` int64 (nodes accepted) and, with uniforms, the ``[batch, vocab]`` row of
the final draw; without, ``[batch]`` float64 the expected tokens emitted."""


def _walk_rows(tree: _Tree, uniforms: torch.Tensor | None) -> _Walked:
    """The traversal of per-row topologies: a loop of steps, each row at its own node.

    Each step, a row enters its current node's next child, or tests the node and (when it
    fails) moves back to the parent, or idles once done; the states of the ancestors of the
    current node live on a stack indexed by depth. Without uniforms every test below the
    root fails while the probability of each outcome is accumulated.
    """
    target, draft, ids, work = tree.target, tree.draft, tree.ids, tree.work
    batch, n, vocab = target.shape
    device = target.device
    table = _valid_children(tree)
    rows = torch.arange(batch, device=device)
    width, max_depth = table.shape[-1], tree.max_depth
    levels = max_depth + 1
    node = torch.zeros(batch, dtype=torch.int64, device=device)
    slot = torch.zeros(batch, dtype=torch.int64, device=device)
    w = torch.ones(batch, dtype=torch.float64, device=device)
    q, p = target[:, 0].to(work), draft[:, 0].to(work)
    stack_node = torch.zeros(batch, levels, dtype=torch.int64, device=device)
    stack_slot = torch.zeros(batch, levels, dtype=torch.int64, device=device)
    stack_w = torch.ones(batch, levels, dtype=torch.float64, device=device)
    stack_q = torch.zeros(batch, levels, vocab, dtype=work, device=device)
    stack_p = torch.zeros(batch, levels, vocab, dtype=work, device=device)
    depth = torch.zeros(batch, dtype=torch.int64, device=device)
    active = torch.ones(batch, dtype=torch.bool, device=device)
    survive = torch.ones(batch, dtype=torch.float64, device=device)
    expected = torch.zeros(batch, dtype=torch.float64, device=device)
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
        stack_node[rows, depth] = node
        stack_slot[rows, depth] = slot + 1
        stack_w[rows, depth] = w
        stack_q[rows, depth] = q
        stack_p[rows, depth] = p

        entered = child.clamp(min=0)
        token = ids[rows, entered].clamp(0, vocab - 1).unsqueeze(-1)
        q_x = q.gather(1, token).squeeze(-1).to(torch.float64)
        p_x = p.gather(1, token).squeeze(-1).to(torch.float64)
        w_child = _child_weight(w, q_x, p_x)

        up = (depth - 1).clamp(min=0)
        own = ids[rows, node].clamp(0, vocab - 1)
        w_up, q_up, p_up = _deleted(
            stack_w[rows, up], stack_q[rows, up], stack_p[rows, up], own, tree.remove
        )
        w_up = torch.where(up == 0, 1.0, w_up)

        into, back = descend.unsqueeze(-1), reject.unsqueeze(-1)
        q = torch.where(into, target[rows, entered].to(work), torch.where(back, q_up, q))
        p = torch.where(into, draft[rows, entered].to(work), torch.where(back, p_up, p))
        w = torch.where(descend, w_child, torch.where(reject, w_up, w))
        node = torch.where(descend, child, torch.where(reject, stack_node[rows, up], node))
        slot = torch.where(descend, 0, torch.where(reject, stack_slot[rows, up], slot))
        depth = torch.where(descend, depth + 1, torch.where(reject, up, depth))
        active = active & ~accept
    stack_node[rows, depth] = node
    column = torch.arange(levels, device=device)
    path = torch.where(column <= depth.unsqueeze(-1), stack_node, -1)
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


def _walk_shared(tree: _Tree, uniforms: torch.Tensor | None) -> _Walked:
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


def _traverse(tree: _Tree, uniforms: torch.Tensor | None) -> _Walked:
    """The walk for ``tree``: unrolled on the host for a host topology shared by the batch."""
    if tree.parents.shape[0] == 1 and tree.parents.device.type == "cpu":
        return _walk_shared(tree, uniforms)
    return _walk_rows(tree, uniforms)


def _draft(draft_probs: object, target_probs: torch.Tensor) -> torch.Tensor:
    """``draft_probs`` checked against ``target_probs [batch, N, vocab]``."""
    if draft_probs is None:
        raise ValueError(
            "traversal verification needs draft_probs, the distributions the children were "
            "drawn from; without them use tree_verify(method='onehot'), exact for any children"
        )
    return check_draft_probs(draft_probs, target_probs)


def _checked(
    target_probs: object,
    draft_token_ids: object,
    parents: object,
    drafting: object,
    draft_probs: object,
    max_depth: int | None,
    max_children: int | None,
    strict: bool,
) -> _Tree:
    """The inputs of :func:`traversal_verify` checked (values too with ``strict``)."""
    target, ids, parents = check_tree(target_probs, draft_token_ids, parents)
    check_flag("strict", strict)
    mode = check_traversal_drafting(drafting)
    draft = _draft(draft_probs, target)
    max_depth, max_children = resolve_bounds(parents, max_depth, max_children)
    if strict:
        strict_checks(target, ids, parents, draft)
    remove = mode == "without_replacement"
    return _Tree(target, ids.to(torch.int64), parents, draft, remove, max_depth, max_children)


def traversal_verify(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    parents: torch.Tensor,
    *,
    drafting: Drafting,
    draft_probs: torch.Tensor,
    max_depth: int | None = None,
    max_children: int | None = None,
    uniforms: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    seeds: torch.Tensor | Sequence[int | None] | None = None,
    generators: dict[int, torch.Generator] | None = None,
    positions: torch.Tensor | Sequence[int] | None = None,
    strict: bool = False,
) -> TreeVerifyResult:
    """Verify a token tree per request by traversal verification, exactly.

    The rule, its derivation and the drafting modes it is exact for are in the module
    documentation: leaf to root in post-order, each node tested with block verification's
    weight of its path, a rejected node deleted and its parent's rows replaced by residuals.
    It never accepts fewer tokens in expectation than the top-down rule of the same
    drafting in the enumerated cases (``"mss"`` for i.i.d. children, ``"rrs"`` without
    replacement), and on a chain it is block verification.

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[batch, N, vocab]`` (float16, bfloat16, float32 or float64; float64 inputs are
        processed in float64, others in float32): row ``i`` is the target distribution of
        the token following node ``i``.
    draft_token_ids : torch.Tensor
        ``[batch, N]`` integer: the token of each node (entry 0, the root, is unused).
    parents : torch.Tensor
        ``[batch, N]``, or ``[N]`` for a topology shared by the batch, integer:
        ``parents[b, i] < i`` for a tree node ``i >= 1``, ``-1`` for padding. Children are
        tried in increasing index order, which must not depend on their token values. On
        the CPU or the device of ``target_probs``.
    drafting : {"iid", "without_replacement"}
        How the children of each node were drawn from ``draft_probs``; ``"deterministic"``
        is refused (see :func:`check_traversal_drafting`).
    draft_probs : torch.Tensor
        ``[batch, N, vocab]`` floating: row ``i`` is the distribution node ``i``'s children
        were drawn from.
    max_depth, max_children : int, optional
        Loop bounds, as for :func:`~specsample.rules.tree.tree_verify`: read from a host
        ``parents`` when omitted (else ``N - 1``); smaller values truncate the tree, which
        stays exact.
    uniforms : torch.Tensor, optional
        ``[batch, N]`` float64 in ``[0, 1)`` on the device of ``target_probs``: column
        ``i >= 1`` for the test of node ``i``, column 0 for the final draw (the layout of
        :func:`traversal_uniforms`); drawn when omitted.
    generator : torch.Generator, optional
        Randomness of the requests with neither a seed nor a generator of their own.
    seeds : torch.Tensor or sequence of (int or None), optional
        ``[batch]`` per-request seeds, as for :func:`~specsample.rules.tree.tree_verify`; a
        seeded request reads :attr:`~specsample.random.Stream.TRAVERSAL` and its output
        depends only on its seed, its position and its own rows.
    generators : dict of int to torch.Generator, optional
        Per-request generators (a request listed here must not also have a seed).
    positions : torch.Tensor or sequence of int, optional
        ``[batch]`` absolute position of each request's first draft (default 0), in
        ``[0, 2**40)``; advance it by ``num_emitted`` from step to step.
    strict : bool
        Also check values (tree structure, token ids, probabilities finite and
        non-negative, positions and given uniforms in range); this synchronises.

    Returns
    -------
    TreeVerifyResult
        ``path [batch, max_depth + 1]``, ``token_ids [batch, max_depth + 1]`` and
        ``num_emitted [batch]``, as from :func:`~specsample.rules.tree.tree_verify`.

    Raises
    ------
    ValueError
        ``drafting="deterministic"`` or unknown, ``draft_probs`` missing, malformed shapes.
    TypeError
        Arguments of the wrong type or dtype.

    Examples
    --------
    Root children: node 1 (token 0), whose child is node 2 (token 1), and node 3 (token 1).
    The draft proposes tokens 0 and 1 with probability 1/2 each everywhere; the target
    gives token 0 probability 1/4 at the root and is uniform below. Node 1 has weight
    ``min(1, 1/4 / (1/2)) = 1/2`` and node 2 the weight of its path,
    ``min(1, 1/2 * (1/2) / (1/2)) = 1/2``. Node 2, the first leaf, is tested first; with
    these uniforms it passes (``0.3 < 1/2``) and the final token is drawn from its row:

    >>> import torch
    >>> parents = torch.tensor([-1, 0, 1, 0])
    >>> tokens = torch.tensor([[-1, 0, 1, 1]])
    >>> target = torch.tensor([[[0.25, 0.75], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]])
    >>> draft = torch.full((1, 4, 2), 0.5)
    >>> u = torch.tensor([[0.9, 0.99, 0.3, 0.99]], dtype=torch.float64)
    >>> out = traversal_verify(target, tokens, parents, drafting="iid", draft_probs=draft,
    ...                        uniforms=u)
    >>> out.path.tolist(), out.token_ids.tolist(), out.num_emitted.tolist()
    ([[0, 1, 2]], [[0, 1, 1]], [3])

    Deterministic children are refused:

    >>> traversal_verify(target, tokens, parents, drafting="deterministic",
    ...                  draft_probs=draft)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: drafting='deterministic' is refused: traversal verification weighs every ...
    """
    tree = _checked(
        target_probs, draft_token_ids, parents, drafting, draft_probs,
        max_depth, max_children, strict,
    )  # fmt: skip
    drawn = _step_uniforms(
        uniforms,
        tree.target,
        generator=generator,
        seeds=seeds,
        generators=generators,
        positions=positions,
        strict=strict,
    )
    path, depth, final_row = _traverse(tree, drawn)
    final = inverse_cdf(final_row, drawn[:, 0])[0]
    rows = torch.arange(path.shape[0], device=path.device).unsqueeze(-1)
    below = torch.where(path[:, 1:] >= 0, tree.ids[rows, path[:, 1:].clamp(min=0)], -1)
    tokens = torch.cat([below, torch.full_like(depth, -1).unsqueeze(-1)], dim=1)
    tokens = tokens.scatter(1, depth.unsqueeze(-1), final.unsqueeze(-1))
    return TreeVerifyResult(path, tokens, depth + 1)


def traversal_expected_tokens(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    parents: torch.Tensor,
    *,
    drafting: Drafting,
    draft_probs: torch.Tensor,
    max_depth: int | None = None,
    max_children: int | None = None,
) -> torch.Tensor:
    """Exact expected tokens emitted by :func:`traversal_verify` on each given tree.

    The tests are tried in a fixed order until one passes, so the expectation over the
    verifier's uniforms is ``sum_t (prod_{s < t} (1 - w_s)) w_t (depth_t + 1)``, the sum
    running over the nodes in the order they are tested (the root last, ``w = 1``), with
    the weights they have when all earlier tests failed. Averaging it over the drafting law
    of the trees gives the exact tokens per step.

    Parameters
    ----------
    target_probs, draft_token_ids, parents, drafting, draft_probs, max_depth, max_children
        As for :func:`traversal_verify`.

    Returns
    -------
    torch.Tensor
        ``[batch]`` float64 in ``[1, max_depth + 1]``.

    Examples
    --------
    The tree of :func:`traversal_verify`'s example: node 2's path passes with probability
    1/2 (3 tokens). Otherwise node 1's residual ``max(1/2 q_1 - p_1, 0)`` is empty, so its
    weight becomes 0; the root's residual is ``(0, 1)``, against which node 3 (token 1)
    passes surely (2 tokens): ``1/2 * 3 + 1/2 * 2``.

    >>> import torch
    >>> parents = torch.tensor([-1, 0, 1, 0])
    >>> tokens = torch.tensor([[-1, 0, 1, 1]])
    >>> target = torch.tensor([[[0.25, 0.75], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]]],
    ...                       dtype=torch.float64)
    >>> draft = torch.full((1, 4, 2), 0.5, dtype=torch.float64)
    >>> traversal_expected_tokens(target, tokens, parents, drafting="iid", draft_probs=draft)
    tensor([2.5000], dtype=torch.float64)
    """
    tree = _checked(
        target_probs, draft_token_ids, parents, drafting, draft_probs,
        max_depth, max_children, False,
    )  # fmt: skip
    return _traverse(tree, None)[2]
