"""The functional API for token trees: :func:`verify_tree` on ``[batch, nodes, vocab]`` logits.

A drafter may propose a *tree* of continuations per request instead of a chain (see
:mod:`specsample.rules.tree` for the rules and why the drafting mode decides them). The
target scores every node in one forward; :func:`verify_tree` processes its logits with each
request's parameters (temperature, top-k, top-p, min-p; temperature 0 is greedy), accepts a
path down the tree and emits one more token, through the same pipeline and backend seam as
:func:`specsample.verify`. Nothing synchronises with the device unless ``strict=True``.
"""

from __future__ import annotations

import torch
from typing_extensions import Unpack

from specsample import backends, pipeline
from specsample.api.options import RequestOptions, check_names, requests_from
from specsample.methods import check_method, check_traversal_drafting, tree_method, tree_methods
from specsample.params import DraftTree, Requests
from specsample.params.checks import (
    check_backend,
    check_draft_rows,
    check_flag,
    check_not_nan,
    check_prob_values,
    check_same_device,
    check_token_ids,
    check_vocab_rows,
    require_data,
    require_rank,
    require_tensor,
)
from specsample.params.seeding import check_position_values
from specsample.plan import TreeStep
from specsample.rules.rows import unit_columns
from specsample.rules.tree.structure import (
    TreeVerifyResult,
    check_tree,
    check_tree_values,
    child_table,
)


def verify_tree(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    parents: torch.Tensor | DraftTree,
    *,
    draft_probs: torch.Tensor | None = None,
    requests: Requests | None = None,
    method: str | None = None,
    drafting: str = "iid",
    backend: str = "auto",
    max_depth: int | None = None,
    max_children: int | None = None,
    strict: bool = False,
    **options: Unpack[RequestOptions],
) -> TreeVerifyResult:
    """Verify a token tree per request from the target's logits at every node.

    Parameters
    ----------
    target_logits : torch.Tensor
        ``[batch, nodes, vocab]`` (float32, float16, bfloat16 or float64, ``vocab >= 1``)
        logits: row ``i`` is the target after node ``i`` (node 0 is the root, the last
        committed token).
    draft_token_ids : torch.Tensor
        ``[batch, nodes]`` int64 or int32 token of each node (the root's is not read).
    parents : torch.Tensor or DraftTree
        ``[batch, nodes]`` (or ``[nodes]``, shared) int64 parent of each node, smaller than
        its index (``-1`` for the root and for padding); or the whole draft layout, built
        once (:meth:`specsample.params.DraftTree.build`, then ``drafting``, ``max_depth``
        and ``max_children`` are read from it).
    draft_probs : torch.Tensor, optional
        ``[batch, nodes, vocab]`` (float32, float16, bfloat16 or float64): row ``i`` is the
        distribution node ``i``'s children were drawn from (needed by ``"mss"``, ``"rrs"``
        and ``"traversal"``; the rows of nodes without children are not read).
    requests : Requests, optional
        What every request asks, validated once (:meth:`specsample.params.Requests.build`).
        Exclusive with the sampling keywords.
    method : str, optional
        A tree rule of :func:`specsample.methods.tree_methods` exact for ``drafting``;
        ``None``: the rule ``drafting`` derives (``"traversal"`` must be asked for).
    drafting : str
        How the children were drafted: ``"iid"``, ``"without_replacement"`` or
        ``"deterministic"`` (see :mod:`specsample.rules.tree`).
    backend : str
        ``"auto"``, ``"torch"``, ``"triton"`` or ``"cpu"`` (see :mod:`specsample.backends`; every
        backend runs the tree rules in PyTorch for now).
    max_depth, max_children : int, optional
        Loop bounds: the deepest level and the most children tried per node (smaller
        values than the tree's truncate it; larger ones than ``nodes - 1`` cost no more
        work than ``nodes - 1``, they set only the output's and the uniforms' layout).
    strict : bool
        Also check values, as :func:`specsample.verify` does (NaN logits, the tree's
        parents and node tokens, draft probabilities finite, non-negative and, at nodes with
        children, summing to 1, positions, parameters and given uniforms); this
        synchronises with the device.
    **options
        Keywords of :class:`specsample.api.options.RequestOptions`: ``temperature``,
        ``top_k``, ``top_p``, ``min_p``, ``seeds``, ``generators``, ``generator``,
        ``positions`` (as in :func:`specsample.verify`) and ``uniforms`` (the step's
        uniforms in the rule's layout, :func:`specsample.rules.tree.tree_uniforms` or
        :func:`specsample.rules.tree.traversal_uniforms`).

    Returns
    -------
    TreeVerifyResult
        ``path [batch, max_depth + 1]`` (accepted nodes from the root, then -1),
        ``token_ids [batch, max_depth + 1]`` (their tokens, one more token, then -1) and
        ``num_emitted [batch]``.

    Raises
    ------
    TypeError, ValueError
        An argument of the wrong type, value, shape or device (the message names it); a
        method that is not exact for ``drafting``.

    Examples
    --------
    >>> import torch
    >>> logits = torch.tensor([[[0.0, 9.0], [9.0, 0.0], [0.0, 0.0]]])
    >>> ids, parents = torch.tensor([[0, 1, 0]]), torch.tensor([[-1, 0, 0]])
    >>> out = verify_tree(logits, ids, parents, drafting="deterministic", temperature=0.0)
    >>> out.path.tolist(), out.token_ids.tolist()
    ([[0, 1]], [[1, 0]])
    """
    check_names("verify_tree", options, RequestOptions.__annotations__)
    target_logits = require_tensor("target_logits", target_logits)
    draft_token_ids = require_tensor("draft_token_ids", draft_token_ids)
    check_flag("strict", strict)
    check_backend(backend, backends.BACKENDS)
    draft_probs = _check_tensors(target_logits, draft_token_ids, draft_probs)
    target_logits = unit_columns(target_logits)
    tree = parents
    if not isinstance(tree, DraftTree):
        tree = DraftTree.build(tree, drafting, max_depth=max_depth, max_children=max_children)
    check_same_device("parents", tree.parents, target_logits)
    rule = _rule(method, tree.drafting)
    chosen = backends.resolve(backend, target_logits)
    batch = target_logits.shape[0]
    requests = requests_from(requests, options, batch, target_logits.device, strict=strict)
    if strict:
        _strict_checks(target_logits, draft_token_ids, tree.parents, draft_probs, requests)
    uniforms = options.get("uniforms")
    step = TreeStep(
        target_logits, draft_token_ids, tree, requests, rule, draft_probs, uniforms, strict
    )
    return pipeline.run_tree(step, backend=chosen)


def _rule(method: object, drafting: str) -> str:
    """The rule to run: ``method`` checked against the registry and exact for ``drafting``,
    or the rule ``drafting`` derives."""
    if method is None:
        return tree_method(drafting)
    check_method(method, tree_methods())
    if method == "traversal":
        check_traversal_drafting(drafting)
        return "traversal"
    return tree_method(drafting, str(method))


def _check_tensors(
    target_logits: torch.Tensor, draft_token_ids: torch.Tensor, draft_probs: object
) -> torch.Tensor | None:
    """Rank, dtype and device checks of the node tensors, those of :func:`specsample.verify`
    in the tree's layout (no sync); the draft rows checked, or ``None``."""
    require_rank("target_logits", target_logits, 3, "[batch, nodes, vocab]")
    check_vocab_rows("target_logits", target_logits)
    if target_logits.shape[1] == 0:
        raise ValueError(
            f"target_logits needs at least one node (the root), got {tuple(target_logits.shape)}"
        )
    check_token_ids("draft_token_ids", draft_token_ids, 2, "[batch, nodes]")
    check_same_device("draft_token_ids", draft_token_ids, target_logits)
    if draft_probs is None:
        return None
    shape = tuple(target_logits.shape)
    return check_draft_rows(
        "draft_probs", draft_probs, shape, "[batch, nodes, vocab]", target_logits
    )


def _strict_checks(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    parents: torch.Tensor,
    draft_probs: torch.Tensor | None,
    requests: Requests,
) -> None:
    """The value checks of strict mode (they synchronise with the device), whatever rule runs.

    Those of :func:`specsample.verify` on the target rows, the draft rows and the positions,
    and the tree's parents and node tokens. Only the draft rows of nodes with children must
    sum to 1: no child was drawn from the others.
    """
    require_data("target_logits", target_logits)
    check_position_values(requests.positions)
    _, ids, rows = check_tree(target_logits, draft_token_ids, parents)
    check_tree_values(ids, rows, target_logits.shape[2])
    check_not_nan("target_logits", target_logits)
    if draft_probs is not None:
        table = child_table(rows.to(draft_probs.device, torch.int64), target_logits.shape[0], 1)
        check_prob_values("draft_probs", draft_probs, table[..., 0] >= 0)
