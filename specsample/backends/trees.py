"""The PyTorch backend's tree step: the tree rules of :mod:`specsample.rules.tree` on logits.

The target rows are processed with each request's parameters (greedy rows become the
one-hot distribution of their argmax), then the rule the method names runs: the top-down
rules (MSS, RRS, one-hot) or traversal verification. A batch of greedy requests only
follows the argmax down the tree, with no distribution materialised.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import cast

from specsample.params.checks import check_step_uniforms
from specsample.plan import TreeStep
from specsample.probs import request_probs
from specsample.rules.tree import (
    Drafting,
    TreeMethod,
    traversal_verify,
    tree_verify,
    tree_verify_greedy,
)
from specsample.rules.tree.structure import TreeVerifyResult, check_tree, resolve_bounds


def tree_step(step: TreeStep) -> TreeVerifyResult:
    """Verify a token tree per request: the accepted path and one more token.

    Parameters
    ----------
    step : TreeStep
        The target's logits at every node, the node tokens, the tree (parents, drafting,
        bounds), the requests, the rule, the draft rows, given uniforms and strictness.

    Returns
    -------
    TreeVerifyResult
        ``path``, ``token_ids`` ``[batch, max_depth + 1]`` and ``num_emitted`` ``[batch]``.

    Examples
    --------
    >>> import torch
    >>> from specsample.params import DraftTree, Requests, SamplingParams
    >>> logits = torch.tensor([[[0.0, 9.0], [9.0, 0.0]]])
    >>> tree = DraftTree.build(torch.tensor([-1, 0]), "deterministic")
    >>> requests = Requests.build(1, torch.device("cpu"), SamplingParams(temperature=0.0))
    >>> tree_step(TreeStep(logits, torch.tensor([[0, 1]]), tree, requests, "onehot")).token_ids
    tensor([[1, 0]])
    """
    logits, ids, tree, requests, method, draft_probs, uniforms, strict = step
    if requests.all_greedy:
        _check_unread_uniforms(step)
        return tree_verify_greedy(
            logits, ids, tree.parents, max_depth=tree.max_depth, max_children=tree.max_children
        )
    probs = request_probs(logits, requests.sampling)
    rule: Callable[..., TreeVerifyResult]
    if method == "traversal":
        if draft_probs is None:
            raise ValueError("method='traversal' needs draft_probs")
        rule = cast(Callable[..., TreeVerifyResult], traversal_verify)
    else:
        rule = partial(tree_verify, method=cast(TreeMethod, method))
    return rule(
        probs,
        ids,
        tree.parents,
        drafting=cast(Drafting, tree.drafting),
        draft_probs=draft_probs,
        max_depth=tree.max_depth,
        max_children=tree.max_children,
        uniforms=uniforms,
        seeding=None if uniforms is not None else requests.seeding,
        positions=requests.positions,
        strict=strict,
    )


def _check_unread_uniforms(step: TreeStep) -> None:
    """Given uniforms that a greedy batch does not read, checked as when they are read: the
    shape of the rule's layout, float64, on the batch's device (no sync)."""
    logits, ids, tree, _, method, _, uniforms, _ = step
    if uniforms is None:
        return
    batch, nodes, _ = logits.shape
    columns = nodes
    if method != "traversal":
        parents = check_tree(logits, ids, tree.parents)[2]
        depth, children = resolve_bounds(parents, tree.max_depth, tree.max_children)
        columns = depth * children + 1
    check_step_uniforms(uniforms, batch, columns, logits.device)
