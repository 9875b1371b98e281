"""The tree verification rules: the choice of a rule for a drafting mode, the sampled walk
(MSS, RRS, one-hot) and the greedy walk. See :mod:`specsample.rules.tree` for the rules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

import torch

from specsample.checks import check_flag, check_uniform_values, require_tensor
from specsample.random import inverse_cdf
from specsample.rules.tree.structure import (
    Walk,
    check_tree,
    child_table,
    resolve_bounds,
    strict_checks,
)
from specsample.rules.tree.uniforms import tree_uniforms
from specsample.seeding import check_position_values, positions_from, seeding_from
from specsample.shared import TreeVerifyResult

Drafting = Literal["iid", "without_replacement", "deterministic"]
TreeMethod = Literal["mss", "rrs", "onehot"]

TREE_DRAFTING: tuple[Drafting, ...] = ("iid", "without_replacement", "deterministic")
"""Drafting modes :func:`tree_verify` knows."""

TREE_METHODS: tuple[TreeMethod, ...] = ("mss", "rrs", "onehot")
"""Verification rules :func:`tree_verify` can run."""

_DERIVED = {"iid": "mss", "without_replacement": "rrs", "deterministic": "onehot"}

_BIASED = {
    ("iid", "rrs"): (
        "RRS removes each rejected token from the draft distribution, which describes "
        "children drawn without replacement; i.i.d. children can repeat a token, so the "
        "output would be biased"
    ),
    ("without_replacement", "mss"): (
        "MSS tests every child against the unchanged draft distribution, but a child drawn "
        "without replacement follows the draft with its earlier siblings removed, so the "
        "output would be biased; use the derived rule 'rrs'"
    ),
    ("deterministic", "mss"): (
        "MSS treats each child as a sample from draft_probs, which deterministic children "
        "(top-k, n-gram, ...) are not; the output would be badly biased (a total variation "
        "of 0.3 in the first token on small examples); use the derived rule 'onehot'"
    ),
    ("deterministic", "rrs"): (
        "RRS treats each child as a sample from draft_probs, which deterministic children "
        "(top-k, n-gram, ...) are not; the output would be badly biased; use the derived "
        "rule 'onehot'"
    ),
}


def tree_method(drafting: str, method: str | None = None) -> str:
    """The verification rule for a drafting mode, refusing biased combinations.

    Parameters
    ----------
    drafting : str
        How the children were drafted: one of :data:`TREE_DRAFTING`.
    method : str, optional
        An explicit rule (one of :data:`TREE_METHODS`). It must be exact for ``drafting``:
        the derived rule, or ``"onehot"`` (exact for every drafting mode).

    Returns
    -------
    str
        The rule to run.

    Raises
    ------
    TypeError
        When ``drafting`` or ``method`` is not a string.
    ValueError
        For an unknown name, or a rule that is biased for ``drafting`` (the message says why).

    Examples
    --------
    >>> tree_method("iid"), tree_method("without_replacement"), tree_method("deterministic")
    ('mss', 'rrs', 'onehot')
    >>> tree_method("iid", "onehot")
    'onehot'
    >>> tree_method("deterministic", "mss")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: method='mss' is biased with drafting='deterministic': MSS treats each child ...
    """
    if not isinstance(drafting, str):
        raise TypeError(
            f"drafting must be a str, one of {TREE_DRAFTING}, got {type(drafting).__name__}"
        )
    if drafting not in _DERIVED:
        raise ValueError(f"drafting must be one of {TREE_DRAFTING}, got {drafting!r}")
    if method is None:
        return _DERIVED[drafting]
    if not isinstance(method, str):
        raise TypeError(
            f"method must be a str, one of {TREE_METHODS}, or None, got {type(method).__name__}"
        )
    if method == "traversal":
        raise ValueError(
            "method='traversal' has its own entry point, traversal_verify (its uniforms are "
            "laid out per node); tree_verify runs the top-down rules "
            f"{TREE_METHODS}"
        )
    if method not in TREE_METHODS:
        raise ValueError(f"method must be one of {TREE_METHODS} or None, got {method!r}")
    reason = _BIASED.get((drafting, method))
    if reason is not None:
        raise ValueError(f"method={method!r} is biased with drafting={drafting!r}: {reason}")
    return method


def _normalized(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """``weights / sum(weights)`` per row; ``fallback`` where the sum is not positive and finite."""
    mass = weights.sum(dim=-1, keepdim=True, dtype=torch.float64)
    ok = (mass > 0) & torch.isfinite(mass)
    scaled = weights / torch.where(ok, mass, 1.0).to(weights.dtype)
    return torch.where(ok, scaled, fallback)


def _without(rows: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
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
        return u < q_at, _normalized(_without(q, token), q), None
    p_at = p.gather(1, token.unsqueeze(-1)).squeeze(-1).to(torch.float64)
    residual = _normalized((q - p).clamp_(min=0.0), q)
    if method == "rrs":
        p = _normalized(_without(p, token), torch.zeros_like(p))
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
    batch, _, vocab = target_probs.shape
    device = target_probs.device
    work = torch.float64 if target_probs.dtype == torch.float64 else torch.float32
    ids = draft_token_ids.to(torch.int64)
    table = child_table(parents.to(device=device, dtype=torch.int64), batch, max_children)
    walk = Walk.start(batch, max_depth, device)
    rows = walk.rows
    if method == "onehot":
        draft_probs = None
    q = target_probs[:, 0].to(work)
    p = None if draft_probs is None else draft_probs[:, 0].to(work)
    for level in range(max_depth):
        found = torch.zeros(batch, dtype=torch.bool, device=device)
        chosen = walk.current
        for j in range(max_children):
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


def _step_uniforms(
    uniforms: object,
    batch: int,
    bounds: tuple[int, int],
    device: torch.device,
    *,
    generator: torch.Generator | None,
    seeds: torch.Tensor | Sequence[int | None] | None,
    generators: Mapping[int, torch.Generator] | None,
    positions: torch.Tensor | Sequence[int] | None,
    strict: bool,
) -> torch.Tensor:
    """The given ``uniforms`` checked, or the step's own drawn: ``[batch, tests + 1]`` float64."""
    if uniforms is None:
        seeding = seeding_from(
            batch, device, seeds=seeds, generators=generators, generator=generator
        )
        at = positions_from(positions, batch, device)
        if strict:
            check_position_values(at)
        return tree_uniforms(seeding, *bounds, device, at)
    if seeds is not None or generators is not None:
        raise ValueError("pass uniforms or seeds/generators, not both")
    columns = bounds[0] * bounds[1] + 1
    layout = "max_depth * max_children + 1 columns"
    return check_given_uniforms(uniforms, (batch, columns), layout, device, strict)


def check_given_uniforms(
    uniforms: object,
    shape: tuple[int, int],
    layout: str,
    device: torch.device,
    strict: bool,
) -> torch.Tensor:
    """Caller-given tree uniforms: float64 of ``shape`` on ``device`` (values in strict mode).

    ``layout`` says in the message what the columns are.

    Examples
    --------
    >>> check_given_uniforms(torch.zeros(1, 2), (1, 3), "3 columns", torch.device("cpu"), False)
    Traceback (most recent call last):
    ...
    ValueError: uniforms must have shape (1, 3) (3 columns), got (1, 2)
    """
    uniforms = require_tensor("uniforms", uniforms)
    if uniforms.shape != shape:
        raise ValueError(
            f"uniforms must have shape {shape} ({layout}), got {tuple(uniforms.shape)}"
        )
    if uniforms.dtype != torch.float64:
        raise TypeError(f"uniforms must be float64, got {uniforms.dtype}")
    if uniforms.device != device:
        raise ValueError(f"uniforms is on {uniforms.device} but target_probs is on {device}")
    if strict:
        check_uniform_values(uniforms)
    return uniforms


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
    generator: torch.Generator | None = None,
    seeds: torch.Tensor | Sequence[int | None] | None = None,
    generators: dict[int, torch.Generator] | None = None,
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
        Explicit rule; must be exact for ``drafting`` (see :func:`tree_method`).
    max_depth, max_children : int, optional
        Loop bounds: the depth of the deepest node and the most children of any node.
        When omitted they are read from ``parents`` if it is a host tensor, and otherwise
        set to ``N - 1``, correct but slower: pass them when ``parents`` lives on an
        accelerator. Smaller values truncate the tree, which stays exact. When the
        uniforms are drawn, ``max_depth * max_children <= TREE_STRIDE``.
    uniforms : torch.Tensor, optional
        ``[batch, max_depth * max_children + 1]`` float64 in ``[0, 1)`` on the device of
        ``target_probs``, laid out as by :func:`tree_uniforms`; drawn when omitted.
    generator : torch.Generator, optional
        Randomness of the requests with neither a seed nor a generator of their own (when
        ``uniforms`` is omitted; torch's default generator when ``None``).
    seeds : torch.Tensor or sequence of (int or None), optional
        ``[batch]`` per-request seeds: an int64 or int32 tensor (negative: not seeded) on
        the CPU or the device of ``target_probs``, or host ints in ``[0, 2**64)`` (``None``
        or -1: not seeded). A seeded request's output depends only on its seed, its
        position and its own rows.
    generators : dict of int to torch.Generator, optional
        Per-request generators (vLLM's ``seeded_seqs``): request ``i`` draws all its numbers
        from ``generators[i]``, so its output does not depend on the other requests. A
        request listed here must not also have a seed.
    positions : torch.Tensor or sequence of int, optional
        ``[batch]`` absolute position of each request's first draft (the number of tokens
        before it; default 0), in ``[0, 2**40)``: host ints, or an int64 or int32 tensor on
        the CPU or the device of ``target_probs``. Advance it by ``num_emitted`` from step
        to step, so that seeded requests never read a counter twice.
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
    >>> out = tree_verify(target, tokens, parents, drafting="deterministic", seeds=[7])
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
    drawn = _step_uniforms(
        uniforms,
        target_probs.shape[0],
        bounds,
        target_probs.device,
        generator=generator,
        seeds=seeds,
        generators=generators,
        positions=positions,
        strict=strict,
    )
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
    batch = target_probs.shape[0]
    max_depth, max_children = resolve_bounds(parents, max_depth, max_children)
    device = target_probs.device
    ids = draft_token_ids.to(torch.int64)
    table = child_table(parents.to(device=device, dtype=torch.int64), batch, max_children)
    best = target_probs.argmax(dim=-1)
    walk = Walk.start(batch, max_depth, device)
    rows = walk.rows
    for level in range(max_depth):
        target_token = best[rows, walk.current]
        found = torch.zeros(batch, dtype=torch.bool, device=device)
        chosen = walk.current
        for j in range(max_children):
            child = table[rows, walk.current, j]
            match = ~found & (child >= 0) & (ids[rows, child.clamp(min=0)] == target_token)
            chosen = torch.where(match, child, chosen)
            found = found | match
        walk.descend(level, found, chosen, ids)
    return walk.finish(best[rows, walk.current])
