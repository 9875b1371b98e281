"""Exact verification of a token tree (several drafts per position).

A drafter may propose a *tree* of continuations instead of a single chain: node 0 is the
root (the last committed token), and every other node ``i`` is a drafted token
``draft_token_ids[b, i]`` continuing its parent ``parents[b, i] < i``. Verification walks
down from the root: at each node it tries the node's children in index order, accepts at
most one of them and descends into it; when none is accepted (or the node has no children)
it emits one more token and stops. The emitted tokens (the accepted path, then that one
token) follow the target distribution exactly, provided the rule matches how the children
were drafted. Notation as in the rest of the library: ``q`` is the target distribution,
``p`` the draft distribution.

Row convention: ``target_probs[b, i]`` is the target distribution of the token that
follows node ``i`` (that is, of node ``i``'s children, conditioned on the path from the root
to ``i``), and ``draft_probs[b, i]`` the distribution node ``i``'s children were drawn from.

How the tree was drafted decides the rule, so :func:`tree_verify` always takes the drafting
mode (``drafting``) and derives the rule from it:

============================  ============  ====================================================
``drafting``                  rule          children of a node
============================  ============  ====================================================
``"iid"``                     ``"mss"``     drawn independently, with replacement, from ``p_i``
``"without_replacement"``     ``"rrs"``     drawn from ``p_i`` without replacement, in order
                                            (sequentially, or by Gumbel-top-k)
``"deterministic"``           ``"onehot"``  chosen without the verifier's randomness (draft
                                            top-k, n-gram or suffix lookup, beams, ...)
============================  ============  ====================================================

* **MSS** (multi-round speculative sampling, SpecInfer): child ``x`` is accepted when
  ``u * p(x) < q(x)`` (probability ``min(1, q(x) / p(x))``); on rejection
  ``q <- normalize(max(q - p, 0))`` and the next child is tried; if every child fails, the
  token is drawn from the current ``q``.
* **RRS** (recursive rejection sampling): as MSS, and after each rejection of ``x`` the
  draft becomes ``p <- normalize(p with x removed)``, the law of the next sibling.
* **One-hot** (EAGLE, SGLang): the draft is taken as a point mass on each child: ``x`` is
  accepted when ``u < q(x)``; on rejection ``q <- normalize(q with x removed)``; if every
  child fails, the token is drawn from the remaining ``q``. It needs no draft probabilities
  and is exact for *any* children that do not depend on the verifier's random numbers,
  sampled ones included (only with lower acceptance than MSS or RRS).

An explicit ``method`` is accepted when it is exact for the stated drafting (``"onehot"`` for
every mode, otherwise the derived rule) and refused with a :class:`ValueError` otherwise:
MSS or RRS on deterministic children is badly biased (each child is treated as a sample
from ``p`` while it is not: a total variation of 0.3 in the first token on small examples),
MSS on children drawn without replacement is biased (it ignores that a later sibling cannot
repeat an earlier one), RRS on i.i.d. children is biased (it assumes the opposite), and MSS
or RRS without ``draft_probs`` cannot be run. Greedy decoding (temperature 0) has its own function,
:func:`tree_verify_greedy`.

Edge cases, all of which keep the output exact:

* A node whose parent is ``-1`` (padding) or not smaller than its own index is not a child
  of anything. A child whose token lies outside ``[0, vocab)`` is skipped (its slot's uniform
  goes unused). Either way the node and its subtree are never visited, as if absent.
* A residual with no mass (after MSS or RRS, only when ``q == p``, which then rejects with
  probability zero; after the one-hot rule, only when the rejected child had ``q(x) = 1``,
  likewise) falls back to the current target row, the ``q`` in force before the update.
  A draft row emptied by RRS (every token of ``p`` already drafted) becomes all zeros: no
  further child can be a sample from it. No division by zero, hence no NaN, ever occurs.
* ``max_depth`` and ``max_children`` bound the loops. Smaller values than the tree's own
  truncate it (deeper nodes, or later siblings, are ignored), which is still exact: the
  first children of an i.i.d. or without-replacement draw are such a draw themselves.

The work is vectorised over the batch, with Python loops over the depth and over the child
slots of the current node only. Nothing synchronises with the device: every branch is a
:func:`torch.where`, and the loop bounds are host integers (given, computed from a host
``parents`` tensor, or the safe bound ``N - 1``). Each child test uses its own uniform and the
final draw one more, in the layout of :func:`tree_uniforms`.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

import torch

from specsample.random import counter_uniform

__all__ = [
    "TREE_DRAFTING",
    "TREE_METHODS",
    "Drafting",
    "TreeMethod",
    "TreeVerifyResult",
    "tree_bounds",
    "tree_method",
    "tree_uniforms",
    "tree_verify",
    "tree_verify_greedy",
]

Drafting = Literal["iid", "without_replacement", "deterministic"]
TreeMethod = Literal["mss", "rrs", "onehot"]

TREE_DRAFTING: tuple[str, ...] = ("iid", "without_replacement", "deterministic")
"""Drafting modes :func:`tree_verify` knows."""

TREE_METHODS: tuple[str, ...] = ("mss", "rrs", "onehot")
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

_ACCEPT_STREAM = 2
_FINAL_STREAM = 3
_LEVEL_SHIFT = 20


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
    if not isinstance(drafting, str) or drafting not in _DERIVED:
        raise ValueError(f"drafting must be one of {TREE_DRAFTING}, got {drafting!r}")
    if method is None:
        return _DERIVED[drafting]
    if not isinstance(method, str) or method not in TREE_METHODS:
        raise ValueError(f"method must be one of {TREE_METHODS} or None, got {method!r}")
    reason = _BIASED.get((drafting, method))
    if reason is not None:
        raise ValueError(f"method={method!r} is biased with drafting={drafting!r}: {reason}")
    return method


def _check_bound(name: str, value: int | None) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int or None, got {type(value).__name__}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")


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
    node = torch.arange(n, device=parents.device)
    valid = (parents >= 0) & (parents < node) & (node >= 1)
    is_child = (parents.unsqueeze(1) == node.view(1, n, 1)) & valid.unsqueeze(1)
    max_children = int(is_child.sum(dim=-1).max())
    depth = torch.zeros(batch, n, dtype=torch.int64, device=parents.device)
    rows = torch.arange(batch, device=parents.device)
    for i in range(1, n):
        above = depth[rows, parents[:, i].clamp(0, n - 1)] + 1
        depth[:, i] = torch.where(valid[:, i], above, -n)
    return max(int(depth.max()), 0), max_children


def tree_uniforms(
    batch: int,
    max_depth: int,
    max_children: int,
    device: torch.device,
    generator: torch.Generator | None = None,
    seeds: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
) -> torch.Tensor:
    """The uniforms of one tree verification step.

    Column ``level * max_children + j`` decides the test of the ``j``-th child of the node
    reached at depth ``level``; the last column, ``max_depth * max_children``, makes the
    final draw. Seeded rows read the accept tests from counter-based stream 2 at counter
    ``(position + level) * 2**20 + j`` and the final draw from stream 3 at counter
    ``position``, so a decoding loop whose ``positions`` advance by the tokens emitted never
    reuses a number that decided anything (and shares none with the chain rules' streams).

    Parameters
    ----------
    batch, max_depth, max_children : int
        Rows, depth bound and child-slot bound (``max_children < 2**20``).
    device : torch.device
        Where the uniforms live.
    generator : torch.Generator, optional
        For unseeded rows (torch's default generator when ``None``).
    seeds : torch.Tensor, optional
        ``[batch]`` int64 per-row seeds; negative entries are unseeded.
    positions : torch.Tensor, optional
        ``[batch]`` int64 sequence position of each row's first drafted token (default 0).

    Returns
    -------
    torch.Tensor
        ``[batch, max_depth * max_children + 1]`` float64 in ``[0, 1)``.

    Examples
    --------
    >>> import torch
    >>> u = tree_uniforms(2, 2, 3, torch.device("cpu"), seeds=torch.tensor([4, 4]))
    >>> u.shape, bool(torch.equal(u[0], u[1]))
    (torch.Size([2, 7]), True)
    """
    _check_bound("max_depth", max_depth)
    _check_bound("max_children", max_children)
    if max_children >= 1 << _LEVEL_SHIFT:
        raise ValueError(f"max_children must be < {1 << _LEVEL_SHIFT}, got {max_children}")
    tests = max_depth * max_children
    drawn = torch.rand(batch, tests + 1, dtype=torch.float64, device=device, generator=generator)
    if seeds is None:
        return drawn
    seeds = seeds.to(device=device, dtype=torch.int64)
    if seeds.shape != (batch,):
        raise ValueError(f"seeds must have shape ({batch},), got {tuple(seeds.shape)}")
    start = torch.zeros(batch, dtype=torch.int64, device=device)
    if positions is not None:
        if positions.shape != (batch,):
            raise ValueError(f"positions must have shape ({batch},), got {tuple(positions.shape)}")
        start = positions.to(device=device, dtype=torch.int64)
    level = torch.arange(max_depth, device=device).repeat_interleave(max_children)
    slot = torch.arange(max_children, device=device).repeat(max_depth)
    counters = ((start.unsqueeze(-1) + level) << _LEVEL_SHIFT) + slot
    accept = counter_uniform(seeds, counters, _ACCEPT_STREAM)
    final = counter_uniform(seeds, start.unsqueeze(-1), _FINAL_STREAM)
    seeded = torch.cat([accept, final], dim=1)
    return torch.where(seeds.unsqueeze(-1) >= 0, seeded, drawn)


def _require(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _check_tree(
    target_probs: object, draft_token_ids: object, parents: object
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Shape and dtype checks (no synchronisation).

    ``parents`` comes back as ``[batch, N]``, or ``[1, N]`` for a topology shared by the batch.
    """
    target_probs = _require("target_probs", target_probs)
    draft_token_ids = _require("draft_token_ids", draft_token_ids)
    parents = _require("parents", parents)
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
    return target_probs, draft_token_ids, parents


def _resolve_bounds(
    parents: torch.Tensor, max_depth: int | None, max_children: int | None
) -> tuple[int, int]:
    """Loop bounds: the given ones, else read from a host ``parents``, else ``N - 1``."""
    _check_bound("max_depth", max_depth)
    _check_bound("max_children", max_children)
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


def _strict_checks(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    parents: torch.Tensor,
    draft_probs: torch.Tensor | None,
) -> None:
    """Value checks (these synchronise with the device)."""
    n, vocab = target_probs.shape[1], target_probs.shape[2]
    node = torch.arange(n, device=parents.device)
    bad_parent = (parents[:, 1:] < -1) | (parents[:, 1:] >= node[1:])
    if bool(bad_parent.any()):
        raise ValueError("parents must satisfy -1 <= parents[b, i] < i for every node i >= 1")
    ids = draft_token_ids.to(parents.device)
    in_tree = (parents >= 0) & (node >= 1)
    if bool((in_tree & ((ids < 0) | (ids >= vocab))).any()):
        raise ValueError(f"draft_token_ids of tree nodes must lie in [0, {vocab})")
    for name, probs in (("target_probs", target_probs), ("draft_probs", draft_probs)):
        if probs is not None and bool((torch.isnan(probs) | (probs < 0)).any()):
            raise ValueError(f"{name} must be non-negative and free of NaN")


def _walk_start(
    batch: int, max_depth: int, device: torch.device
) -> tuple[torch.Tensor, ...]:
    """State of a walk down the trees, at their roots.

    Returns ``rows [batch]`` (arange), ``current [batch]`` (node, 0), ``active [batch]``
    (True), ``accepted_count [batch]`` (0), ``path [batch, max_depth + 1]`` (visited nodes:
    the root, then -1) and ``tokens [batch, max_depth + 1]`` (-1).
    """
    path = torch.full((batch, max_depth + 1), -1, dtype=torch.int64, device=device)
    path[:, 0] = 0
    return (
        torch.arange(batch, device=device),
        torch.zeros(batch, dtype=torch.int64, device=device),
        torch.ones(batch, dtype=torch.bool, device=device),
        torch.zeros(batch, dtype=torch.int64, device=device),
        path,
        torch.full((batch, max_depth + 1), -1, dtype=torch.int64, device=device),
    )


def _child_table(parents: torch.Tensor, batch: int, max_children: int) -> torch.Tensor:
    """``[batch, N, max_children]``: the ``j``-th child (in index order) of each node, or -1.

    ``parents`` is ``[batch, N]`` or ``[1, N]``; a shared topology is tabulated once and
    expanded.
    """
    rows, n = parents.shape
    node = torch.arange(n, device=parents.device)
    valid = (parents >= 0) & (parents < node) & (node >= 1)
    is_child = (parents.unsqueeze(1) == node.view(1, n, 1)) & valid.unsqueeze(1)
    rank = is_child.to(torch.int64).cumsum(dim=-1) - 1
    slot = torch.where(is_child & (rank < max_children), rank, max_children)
    table = torch.full((rows, n, max_children + 1), -1, dtype=torch.int64, device=parents.device)
    table.scatter_(2, slot, torch.where(is_child, node, -1).expand(rows, n, n).contiguous())
    return table[:, :, :max_children].expand(batch, n, max_children)


def _normalized(weights: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """``weights / sum(weights)`` per row; ``fallback`` where the sum is not positive and finite."""
    mass = weights.sum(dim=-1, keepdim=True, dtype=torch.float64)
    ok = (mass > 0) & torch.isfinite(mass)
    scaled = weights / torch.where(ok, mass, 1.0).to(weights.dtype)
    return torch.where(ok, scaled, fallback)


def _without(rows: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """``rows`` with column ``token[b]`` of row ``b`` set to zero."""
    return rows.scatter(1, token.unsqueeze(-1), 0.0)


def _inverse_cdf(weights: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """Draw one index per row of non-negative ``weights [batch, vocab]`` with ``uniform [batch]``.

    The index ``i`` returned is the first with ``cumsum(weights)[i] > uniform * total``
    (float64 prefix sums), never a column of zero weight when the row has positive mass,
    and always in ``[0, vocab)``.

    Examples
    --------
    >>> import torch
    >>> w = torch.tensor([[0.25, 0.0, 0.75], [0.25, 0.0, 0.75]])
    >>> _inverse_cdf(w, torch.tensor([0.1, 0.5], dtype=torch.float64))
    tensor([0, 2])
    """
    vocab = weights.shape[-1]
    cum = weights.to(torch.float64).cumsum(dim=-1)
    total = cum[:, -1:].contiguous()
    x = uniform.to(torch.float64).unsqueeze(-1) * total
    last_positive = torch.searchsorted(cum, total, right=False)
    index = torch.minimum(torch.searchsorted(cum, x.contiguous(), right=True), last_positive)
    return index.squeeze(-1).clamp_(0, vocab - 1)


def _layout(
    path: torch.Tensor, tokens: torch.Tensor, accepted: torch.Tensor, final: torch.Tensor
) -> TreeVerifyResult:
    tokens = tokens.scatter(1, accepted.unsqueeze(-1), final.unsqueeze(-1))
    return TreeVerifyResult(path, tokens, accepted + 1)


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
    table = _child_table(parents.to(device=device, dtype=torch.int64), batch, max_children)
    rows, current, active, accepted_count, path, tokens = _walk_start(batch, max_depth, device)

    q = target_probs[:, 0].to(work)
    use_draft = method != "onehot"
    p = draft_probs[:, 0].to(work) if use_draft and draft_probs is not None else None
    for level in range(max_depth):
        found = torch.zeros(batch, dtype=torch.bool, device=device)
        chosen = current
        for j in range(max_children):
            child = table[rows, current, j]
            token = ids[rows, child.clamp(min=0)]
            trying = active & ~found & (child >= 0) & (token >= 0) & (token < vocab)
            token = token.clamp(0, vocab - 1)
            u = uniforms[:, level * max_children + j]
            q_at = q.gather(1, token.unsqueeze(-1)).squeeze(-1).to(torch.float64)
            if p is None:
                passed = u < q_at
                residual = _normalized(_without(q, token), q)
            else:
                p_at = p.gather(1, token.unsqueeze(-1)).squeeze(-1).to(torch.float64)
                passed = u * p_at < q_at
                residual = _normalized((q - p).clamp_(min=0.0), q)
            rejected = (trying & ~passed).unsqueeze(-1)
            q = torch.where(rejected, residual, q)
            if p is not None and method == "rrs":
                p = torch.where(rejected, _normalized(_without(p, token), torch.zeros_like(p)), p)
            took = trying & passed
            found = found | took
            chosen = torch.where(took, child, chosen)
        active = active & found
        current = torch.where(active, chosen, current)
        accepted_count = accepted_count + active.to(torch.int64)
        path[:, level + 1] = torch.where(active, current, -1)
        tokens[:, level] = torch.where(active, ids[rows, current], -1)
        q = torch.where(active.unsqueeze(-1), target_probs[rows, current].to(work), q)
        if p is not None and draft_probs is not None:
            p = torch.where(active.unsqueeze(-1), draft_probs[rows, current].to(work), p)
    final = _inverse_cdf(q, uniforms[:, max_depth * max_children])
    return _layout(path, tokens, accepted_count, final)


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
    seeds: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
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
        accelerator. Smaller values truncate the tree, which stays exact.
    uniforms : torch.Tensor, optional
        ``[batch, max_depth * max_children + 1]`` float64 in ``[0, 1)``, laid out as by
        :func:`tree_uniforms`; drawn when omitted.
    generator : torch.Generator, optional
        Randomness for unseeded rows (when ``uniforms`` is omitted).
    seeds : torch.Tensor, optional
        ``[batch]`` int64 per-request seeds (negative: unseeded). A seeded request's output
        depends only on its seed, its position and its own rows.
    positions : torch.Tensor, optional
        ``[batch]`` int64 sequence position of the first drafted token (default 0); advance
        it by ``num_emitted`` from step to step.
    strict : bool
        Also check values (the tree structure, token ids of tree nodes, negative or NaN
        probabilities); this synchronises with the device.

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
    >>> out = tree_verify(target, tokens, parents, drafting="deterministic")
    >>> out.path.tolist(), out.token_ids.tolist(), out.num_emitted.tolist()
    ([[0, 2, -1]], [[1, 2, -1]], [2])

    With sampled children the draft probabilities are needed:

    >>> tree_verify(target, tokens, parents, drafting="iid")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: drafting='iid' (method 'mss') needs draft_probs, the distributions the ...
    """
    target_probs, draft_token_ids, parents = _check_tree(target_probs, draft_token_ids, parents)
    rule = tree_method(drafting, method)
    batch = target_probs.shape[0]
    if rule != "onehot":
        if draft_probs is None:
            raise ValueError(
                f"drafting={drafting!r} (method {rule!r}) needs draft_probs, the distributions "
                "the children were drawn from; without them use method='onehot', exact for "
                "any children"
            )
        draft_probs = _require("draft_probs", draft_probs)
        if draft_probs.shape != target_probs.shape:
            raise ValueError(
                f"draft_probs must have the shape of target_probs {tuple(target_probs.shape)}, "
                f"got {tuple(draft_probs.shape)}"
            )
        if not draft_probs.dtype.is_floating_point:
            raise TypeError(f"draft_probs must be a floating tensor, got {draft_probs.dtype}")
        if draft_probs.device != target_probs.device:
            raise ValueError(
                f"draft_probs is on {draft_probs.device} but target_probs is on "
                f"{target_probs.device}"
            )
    else:
        draft_probs = None
    depth, children = _resolve_bounds(parents, max_depth, max_children)
    if strict:
        _strict_checks(target_probs, draft_token_ids, parents, draft_probs)
    device = target_probs.device
    tests = depth * children
    if uniforms is None:
        uniforms = tree_uniforms(batch, depth, children, device, generator, seeds, positions)
    else:
        uniforms = _require("uniforms", uniforms)
        if seeds is not None:
            raise ValueError("pass uniforms or seeds, not both")
        if uniforms.shape != (batch, tests + 1):
            raise ValueError(
                f"uniforms must have shape {(batch, tests + 1)} "
                f"(max_depth * max_children + 1 columns), got {tuple(uniforms.shape)}"
            )
        uniforms = uniforms.to(device=device, dtype=torch.float64)
    return _verify(
        target_probs, draft_token_ids, parents, draft_probs, rule, depth, children, uniforms
    )


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
    target_probs, draft_token_ids, parents = _check_tree(target_probs, draft_token_ids, parents)
    batch = target_probs.shape[0]
    max_depth, max_children = _resolve_bounds(parents, max_depth, max_children)
    device = target_probs.device
    ids = draft_token_ids.to(torch.int64)
    table = _child_table(parents.to(device=device, dtype=torch.int64), batch, max_children)
    best = target_probs.argmax(dim=-1)
    rows, current, active, accepted_count, path, tokens = _walk_start(batch, max_depth, device)
    for level in range(max_depth):
        target_token = best[rows, current]
        found = torch.zeros(batch, dtype=torch.bool, device=device)
        chosen = current
        for j in range(max_children):
            child = table[rows, current, j]
            match = ~found & (child >= 0) & (ids[rows, child.clamp(min=0)] == target_token)
            chosen = torch.where(match, child, chosen)
            found = found | match
        active = active & found
        current = torch.where(active, chosen, current)
        accepted_count = accepted_count + active.to(torch.int64)
        path[:, level + 1] = torch.where(active, current, -1)
        tokens[:, level] = torch.where(active, ids[rows, current], -1)
    return _layout(path, tokens, accepted_count, best[rows, current])
