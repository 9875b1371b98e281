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

Work. The traversal is vectorised over the batch and never synchronises with the device;
how it walks the trees is in :mod:`specsample.rules.tree.traversal_walk`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from specsample.methods import Drafting, check_traversal_drafting
from specsample.params.checks import check_flag
from specsample.params.seeding import Seeding
from specsample.random import inverse_cdf
from specsample.rules.tree.structure import (
    TreeVerifyResult,
    check_draft_probs,
    check_tree,
    resolve_bounds,
    strict_checks,
)
from specsample.rules.tree.traversal_walk import TraversalTree, traverse
from specsample.rules.tree.uniforms import (
    TREE_STRIDE,
    given_uniforms,
    step_source,
    traversal_uniforms,
)


def _step_uniforms(
    target: torch.Tensor,
    uniforms: object,
    seeding: object,
    positions: torch.Tensor | Sequence[int] | None,
    strict: bool,
) -> torch.Tensor:
    """The given ``uniforms`` checked, or the step's own drawn: ``[batch, N]`` float64."""
    batch, n, _ = target.shape
    device = target.device
    if uniforms is not None:
        return given_uniforms(uniforms, seeding, (batch, n), "one column per node", device, strict)
    source, at = step_source(seeding, positions, batch, device, strict)
    if n > TREE_STRIDE:
        raise ValueError(
            f"target_probs has {n} nodes; drawn uniforms allow at most TREE_STRIDE = "
            f"{TREE_STRIDE} per step (pass uniforms, or a smaller tree)"
        )
    return traversal_uniforms(source, n, device, at)


def _draft(draft_probs: object, target_probs: torch.Tensor) -> torch.Tensor:
    """``draft_probs`` checked against ``target_probs [batch, N, vocab]``."""
    if draft_probs is None:
        raise ValueError(
            "traversal verification needs draft_probs, the distributions the children were "
            "drawn from; without them use tree_verify(method='onehot'), exact for any children"
        )
    return check_draft_probs(draft_probs, target_probs)


def check_traversal(
    target_probs: object,
    draft_token_ids: object,
    parents: object,
    drafting: object,
    draft_probs: object,
    bounds: tuple[int | None, int | None] = (None, None),
    strict: bool = False,
) -> TraversalTree:
    """The inputs of :func:`traversal_verify` checked (values too with ``strict``).

    Parameters
    ----------
    target_probs, draft_token_ids, parents, drafting, draft_probs
        As for :func:`traversal_verify`.
    bounds : tuple of (int or None, int or None)
        ``(max_depth, max_children)``, as for :func:`traversal_verify`.
    strict : bool
        Also check the values, as :func:`traversal_verify` does with ``strict=True``.

    Returns
    -------
    TraversalTree
        The tree the traversal walks, bounds resolved.

    Raises
    ------
    TypeError, ValueError
        As :func:`traversal_verify` does for these arguments.

    Examples
    --------
    >>> import torch
    >>> probs = torch.full((1, 3, 2), 0.5)
    >>> tree = check_traversal(probs, torch.tensor([[-1, 0, 1]]), torch.tensor([-1, 0, 0]),
    ...                        "iid", probs)
    >>> tree.max_depth, tree.max_children
    (1, 2)
    """
    target, ids, parents = check_tree(target_probs, draft_token_ids, parents)
    check_flag("strict", strict)
    mode = check_traversal_drafting(drafting)
    draft = _draft(draft_probs, target)
    max_depth, max_children = resolve_bounds(parents, *bounds)
    if strict:
        strict_checks(target, ids, parents, draft)
    remove = mode == "without_replacement"
    return TraversalTree(
        target, ids.to(torch.int64), parents, draft, remove, max_depth, max_children
    )


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
    seeding: Seeding | None = None,
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
    target_probs, draft_token_ids, parents : torch.Tensor
        ``[batch, N, vocab]`` target rows, ``[batch, N]`` node tokens and ``[batch, N]`` (or
        ``[N]``) parents, as for :func:`~specsample.rules.tree.tree_verify`: children are
        tried in increasing index order, which must not depend on their token values.
    drafting : {"iid", "without_replacement"}
        How the children of each node were drawn from ``draft_probs``; ``"deterministic"``
        is refused (see :func:`specsample.methods.check_traversal_drafting`).
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
    seeding : specsample.params.seeding.Seeding, optional
        Where each request's numbers come from when ``uniforms`` is omitted (``None``:
        torch's default generator), built by :func:`specsample.params.seeding.seeding_from`; a
        seeded request reads :attr:`~specsample.random.Stream.TRAVERSAL` and its output
        depends only on its seed, its position and its own rows.
    positions : torch.Tensor or sequence of int, optional
        ``[batch]`` absolute position of each request's first draft, in ``[0, 2**40)``
        (required when ``seeding`` has seeds); advance it by ``num_emitted`` from step to
        step.
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
    tree = check_traversal(
        target_probs, draft_token_ids, parents, drafting, draft_probs,
        (max_depth, max_children), strict,
    )  # fmt: skip
    drawn = _step_uniforms(tree.target, uniforms, seeding, positions, strict)
    path, depth, final_row = traverse(tree, drawn)
    final = inverse_cdf(final_row, drawn[:, 0])[0]
    rows = torch.arange(path.shape[0], device=path.device).unsqueeze(-1)
    below = torch.where(path[:, 1:] >= 0, tree.ids[rows, path[:, 1:].clamp(min=0)], -1)
    tokens = torch.cat([below, torch.full_like(depth, -1).unsqueeze(-1)], dim=1)
    tokens = tokens.scatter(1, depth.unsqueeze(-1), final.unsqueeze(-1))
    return TreeVerifyResult(path, tokens, depth + 1)


def traversal_expected_tokens(tree: TraversalTree) -> torch.Tensor:
    """Exact expected tokens emitted by :func:`traversal_verify` on each given tree.

    The tests are tried in a fixed order until one passes, so the expectation over the
    verifier's uniforms is ``sum_t (prod_{s < t} (1 - w_s)) w_t (depth_t + 1)``, the sum
    running over the nodes in the order they are tested (the root last, ``w = 1``), with
    the weights they have when all earlier tests failed. Averaging it over the drafting law
    of the trees gives the exact tokens per step.

    Parameters
    ----------
    tree : TraversalTree
        The inputs of :func:`traversal_verify` checked by :func:`check_traversal`.

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
    >>> traversal_expected_tokens(check_traversal(target, tokens, parents, "iid", draft))
    tensor([2.5000], dtype=torch.float64)
    """
    return traverse(tree, None)[2]
