"""The top-down tree verification rules: the sampled walk (MSS, RRS, one-hot) and the greedy
walk. See :mod:`specsample.rules.tree` for the rules; the rule a drafting mode calls for
comes from the registry (:func:`specsample.methods.tree_method`)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specsample.methods import Drafting, TreeMethod, tree_method
from specsample.params.checks import check_flag
from specsample.params.seeding import Seeding
from specsample.random import inverse_cdf
from specsample.rules.tree.structure import (
    TreeVerifyResult,
    Walk,
    check_draft_probs,
    check_tree,
    child_table,
    reachable,
    resolve_bounds,
    strict_checks,
)
from specsample.rules.tree.uniforms import given_uniforms, step_source, tree_uniforms


def normalized(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """``weights / sum(weights)`` per row; ``fallback`` where the sum is not positive and finite."""
    mass = weights.sum(dim=-1, keepdim=True, dtype=torch.float64)
    ok = (mass > 0) & torch.isfinite(mass)
    scaled = weights / torch.where(ok, mass, 1.0).to(weights.dtype)
    return torch.where(ok, scaled, fallback)


def without(rows: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """``rows [batch, vocab]`` with column ``token[b]`` of row ``b`` set to zero."""
    return rows.scatter(1, token.unsqueeze(-1), 0.0)


def _test_child(
    method: str, q: torch.Tensor, p: torch.Tensor | None, token: torch.Tensor, u: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """One child test of every row: child ``token [batch]`` against ``q``, ``p [batch, vocab]``.

    Returns ``passed [batch]`` bool (``u [batch]`` float64 below the acceptance
    probability), and the target and draft rows that follow a rejection (the draft row is
    ``None`` for the one-hot rule, unchanged for MSS).
    """
    q_at = q.gather(1, token.unsqueeze(-1)).squeeze(-1).to(torch.float64)
    if p is None:
        return u < q_at, normalized(without(q, token), q), None
    p_at = p.gather(1, token.unsqueeze(-1)).squeeze(-1).to(torch.float64)
    residual = normalized((q - p).clamp_(min=0.0), q)
    if method == "rrs":
        p = normalized(without(p, token), torch.zeros_like(p))
    return u * p_at < q_at, residual, p


def _verify(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    parents: torch.Tensor,
    draft_probs: torch.Tensor | None,
    method: str,
    max_depth: int,
    max_children: int,
    uniforms: torch.Tensor,
) -> TreeVerifyResult:
    """Run ``method`` without any check that it suits the drafting (inputs already checked)."""
    batch, n, vocab = target_probs.shape
    device = target_probs.device
    work = torch.float64 if target_probs.dtype == torch.float64 else torch.float32
    ids = draft_token_ids.to(torch.int64)
    levels, slots = reachable(n, max_depth, max_children)
    table = child_table(parents.to(device=device, dtype=torch.int64), batch, slots)
    walk = Walk.start(batch, max_depth, device)
    rows = walk.rows
    if method == "onehot":
        draft_probs = None
    q = target_probs[:, 0].to(work)
    p = None if draft_probs is None else draft_probs[:, 0].to(work)
    for level in range(levels):
        found = torch.zeros(batch, dtype=torch.bool, device=device)
        chosen = walk.current
        for j in range(slots):
            child = table[rows, walk.current, j]
            token = ids[rows, child.clamp(min=0)]
            trying = walk.active & ~found & (child >= 0) & (token >= 0) & (token < vocab)
            token = token.clamp(0, vocab - 1)
            u = uniforms[:, level * max_children + j]
            passed, q_next, p_next = _test_child(method, q, p, token, u)
            rejected = (trying & ~passed).unsqueeze(-1)
            q = torch.where(rejected, q_next, q)
            if p is not None and p_next is not None and p_next is not p:
                p = torch.where(rejected, p_next, p)
            took = trying & passed
            found = found | took
            chosen = torch.where(took, child, chosen)
        walk.descend(level, found, chosen, ids)
        moved = walk.active.unsqueeze(-1)
        q = torch.where(moved, target_probs[rows, walk.current].to(work), q)
        if p is not None and draft_probs is not None:
            p = torch.where(moved, draft_probs[rows, walk.current].to(work), p)
    return walk.finish(inverse_cdf(q, uniforms[:, max_depth * max_children])[0])


def _draft_rows(
    drafting: str, rule: str, draft_probs: object, target_probs: torch.Tensor
) -> torch.Tensor | None:
    """``draft_probs`` checked against ``target_probs [batch, N, vocab]``; ``None`` for one-hot."""
    if rule == "onehot":
        return None
    if draft_probs is None:
        raise ValueError(
            f"drafting={drafting!r} (method {rule!r}) needs draft_probs, the distributions "
            "the children were drawn from; without them use method='onehot', exact for "
            "any children"
        )
    return check_draft_probs(draft_probs, target_probs)


def tree_verify(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    parents: torch.Tensor,
    *,
    drafting: Drafting,
    draft_probs: torch.Tensor | None = None,
    method: TreeMethod | None = None,
    max_depth: int | None = None,
    max_children: int | None = None,
    uniforms: torch.Tensor | None = None,
    seeding: Seeding | None = None,
    positions: torch.Tensor | Sequence[int] | None = None,
    strict: bool = False,
) -> TreeVerifyResult:
    """Verify a token tree per request, exactly, with the rule its drafting calls for.

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[batch, N, vocab]`` (float16, bfloat16, float32 or float64; float64 inputs are
        processed in float64, others in float32): row ``i`` is the target distribution of
        the token following node ``i`` (conditioned on the path from the root to ``i``).
    draft_token_ids : torch.Tensor
        ``[batch, N]`` integer: the token of each node (entry 0, the root, is unused).
    parents : torch.Tensor
        ``[batch, N]``, or ``[N]`` for a topology shared by the batch, integer:
        ``parents[b, i] < i`` for a tree node ``i >= 1``, ``-1`` for padding (entry 0 unused).
        Children of a node are tried in increasing index order, which must not depend on
        their token values (for i.i.d. children the drawing order is random, as needed).
        On the CPU (the loop bounds are then read from it) or the device of
        ``target_probs``.
    drafting : {"iid", "without_replacement", "deterministic"}
        How the children of each node were drafted (see the module documentation).
        Required: the rule is derived from it.
    draft_probs : torch.Tensor, optional
        ``[batch, N, vocab]``: row ``i`` is the distribution node ``i``'s children were drawn
        from. Required for ``"iid"`` and ``"without_replacement"``; unused by ``"onehot"``.
    method : {"mss", "rrs", "onehot"}, optional
        Explicit rule; must be exact for ``drafting`` (see
        :func:`specsample.methods.tree_method`).
    max_depth, max_children : int, optional
        Loop bounds: the depth of the deepest node and the most children of any node.
        When omitted they are read from ``parents`` if it is a host tensor, and otherwise
        set to ``N - 1``, correct but slower: pass them when ``parents`` lives on an
        accelerator. Smaller values truncate the tree, which stays exact; larger ones than
        ``N - 1`` cost no more work than ``N - 1`` (they set only the layouts). When the
        uniforms are drawn, ``max_depth * max_children <= TREE_STRIDE``.
    uniforms : torch.Tensor, optional
        ``[batch, max_depth * max_children + 1]`` float64 in ``[0, 1)`` on the device of
        ``target_probs``, laid out as by :func:`tree_uniforms`; drawn when omitted.
    seeding : specsample.params.seeding.Seeding, optional
        Where each request's numbers come from when ``uniforms`` is omitted, built for the
        batch by :func:`specsample.params.seeding.seeding_from` from per-request seeds (a seeded
        request's output depends only on its seed, its position and its own rows),
        per-request generators (vLLM's ``seeded_seqs``) and a shared generator. ``None``:
        every request on torch's default generator. Not with ``uniforms``.
    positions : torch.Tensor or sequence of int, optional
        ``[batch]`` absolute position of each request's first draft (the number of tokens
        before it), in ``[0, 2**40)``: host ints, or an int64 or int32 tensor on the CPU or
        the device of ``target_probs``; required when ``seeding`` has seeds. Advance it by
        ``num_emitted`` from step to step, so that seeded requests never read a counter
        twice.
    strict : bool
        Also check values (the tree structure, token ids of tree nodes, probabilities
        finite and non-negative, positions and given uniforms in range); this
        synchronises with the device.

    Returns
    -------
    TreeVerifyResult
        ``path [batch, max_depth + 1]``, ``token_ids [batch, max_depth + 1]`` and
        ``num_emitted [batch]``.

    Raises
    ------
    ValueError
        Unknown or biased ``drafting``/``method`` combinations, missing ``draft_probs`` for
        MSS or RRS, and malformed shapes.
    TypeError
        Arguments of the wrong type or dtype.

    Examples
    --------
    The root's children are nodes 1 (token 2) and 2 (token 1); node 3 (token 0) is a child
    of node 1. The target is certain at every row, so the outcome does not depend on the
    random numbers: node 1 is rejected (``q(2) = 0`` at the root), node 2 accepted, and as
    node 2 has no children the next token is drawn from its row.

    >>> import torch
    >>> parents = torch.tensor([-1, 0, 0, 1])
    >>> tokens = torch.tensor([[-1, 2, 1, 0]])
    >>> target = torch.tensor([[[0.0, 1.0, 0.0], [1.0, 0.0, 0.0],
    ...                         [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]]])
    >>> from specsample.params.seeding import seeding_from
    >>> seeding = seeding_from(1, torch.device("cpu"), seeds=[7])
    >>> out = tree_verify(
    ...     target, tokens, parents, drafting="deterministic", seeding=seeding, positions=[0]
    ... )
    >>> out.path.tolist(), out.token_ids.tolist(), out.num_emitted.tolist()
    ([[0, 2, -1]], [[1, 2, -1]], [2])

    With sampled children the draft probabilities are needed:

    >>> tree_verify(target, tokens, parents, drafting="iid")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: drafting='iid' (method 'mss') needs draft_probs, the distributions the ...
    """
    target_probs, draft_token_ids, parents = check_tree(target_probs, draft_token_ids, parents)
    check_flag("strict", strict)
    rule = tree_method(drafting, method)
    checked_draft = _draft_rows(drafting, rule, draft_probs, target_probs)
    bounds = resolve_bounds(parents, max_depth, max_children)
    if strict:
        strict_checks(target_probs, draft_token_ids, parents, checked_draft)
    batch, device = target_probs.shape[0], target_probs.device
    if uniforms is None:
        source, at = step_source(seeding, positions, batch, device, strict)
        drawn = tree_uniforms(source, *bounds, device, at)
    else:
        columns = (batch, bounds[0] * bounds[1] + 1)
        layout = "max_depth * max_children + 1 columns"
        drawn = given_uniforms(uniforms, seeding, columns, layout, device, strict)
    return _verify(target_probs, draft_token_ids, parents, checked_draft, rule, *bounds, drawn)


def tree_verify_greedy(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    parents: torch.Tensor,
    *,
    max_depth: int | None = None,
    max_children: int | None = None,
) -> TreeVerifyResult:
    """Greedy (temperature 0) tree verification: follow the target's argmax.

    At each node the first child (in index order) whose token is the argmax of the node's
    target row is followed; when no child matches, that argmax is emitted and the walk
    stops. The emitted tokens are then exactly those of greedy decoding on these rows.
    Ties in the argmax go to the lowest token id (as :func:`torch.argmax`), so rows must
    resolve ties the way the non-speculative path does. Any strictly increasing transform
    of the rows (logits) gives the same result.

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[batch, N, vocab]`` target probabilities or logits, row ``i`` for the token after
        node ``i``.
    draft_token_ids, parents : torch.Tensor
        As for :func:`tree_verify`.
    max_depth, max_children : int, optional
        As for :func:`tree_verify`.

    Returns
    -------
    TreeVerifyResult
        ``path``, ``token_ids`` and ``num_emitted``.

    Examples
    --------
    >>> import torch
    >>> parents = torch.tensor([-1, 0, 0, 2])
    >>> tokens = torch.tensor([[-1, 0, 1, 1]])
    >>> logits = torch.tensor([[[0.0, 3.0], [5.0, 0.0], [0.0, 2.0], [4.0, 0.0]]])
    >>> out = tree_verify_greedy(logits, tokens, parents)
    >>> out.path.tolist(), out.token_ids.tolist(), out.num_emitted.tolist()
    ([[0, 2, 3]], [[1, 1, 0]], [3])
    """
    target_probs, draft_token_ids, parents = check_tree(target_probs, draft_token_ids, parents)
    batch, n, _ = target_probs.shape
    max_depth, max_children = resolve_bounds(parents, max_depth, max_children)
    levels, slots = reachable(n, max_depth, max_children)
    device = target_probs.device
    ids = draft_token_ids.to(torch.int64)
    table = child_table(parents.to(device=device, dtype=torch.int64), batch, slots)
    best = target_probs.argmax(dim=-1)
    walk = Walk.start(batch, max_depth, device)
    rows = walk.rows
    for level in range(levels):
        target_token = best[rows, walk.current]
        found = torch.zeros(batch, dtype=torch.bool, device=device)
        chosen = walk.current
        for j in range(slots):
            child = table[rows, walk.current, j]
            match = ~found & (child >= 0) & (ids[rows, child.clamp(min=0)] == target_token)
            chosen = torch.where(match, child, chosen)
            found = found | match
        walk.descend(level, found, chosen, ids)
    return walk.finish(best[rows, walk.current])
