"""The loop's verification calls, in one place: a chain step (typical acceptance included)
and a tree step.

Each is a call of the public API (:func:`specsample.verify`, :func:`specsample.verify_tree`)
with the step's tensors and the objects the loop built once for its batch: the requests of
the active sequences (:class:`specsample.params.Requests`, moved to each sequence's
absolute position, its committed length, so that randomness is keyed by seed and position)
and the draft layout (:class:`specsample.params.layout.BatchLayout` of ``k`` drafts per sequence,
or the tree's :class:`specsample.params.DraftTree`). The loop around them only drafts, scores
and commits.
"""

from __future__ import annotations

import torch

from specsample import BatchLayout, DraftTree, TreeVerifyResult, verify, verify_tree
from specsample.generate.sampling import SamplingState


def chain_step(
    logits: torch.Tensor,
    drafts: torch.Tensor,
    draft_probs: torch.Tensor | None,
    sampling: SamplingState,
    positions: torch.Tensor,
    *,
    layout: BatchLayout,
    method: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Verify a chain of drafts per sequence (any rule of :func:`specsample.verify`).

    Parameters
    ----------
    logits : torch.Tensor
        ``[batch, k + 1, vocab]`` the target's logits after the last committed token and
        after each draft.
    drafts : torch.Tensor
        ``[batch, k]`` int64 draft tokens.
    draft_probs : torch.Tensor or None
        ``[batch, k, vocab]`` the distributions the drafts were sampled from (``None``:
        one-hot drafts).
    sampling : SamplingState
        The parameters and random sources of the ``batch`` sequences (validated once).
    positions : torch.Tensor
        ``[batch]`` int64 absolute position of each sequence's first draft.
    layout : BatchLayout
        The layout of ``k`` drafts for each of the ``batch`` sequences.
    method : str
        A name of :func:`specsample.methods.chain_methods` ``(lossy=True)``; ``"typical"``
        is LOSSY.

    Returns
    -------
    tuple of torch.Tensor
        ``[batch, k + 1]`` emitted tokens (then -1) and ``[batch]`` how many were emitted.
    """
    size, slots, vocab = logits.shape
    rows = None if draft_probs is None else draft_probs.reshape(size * (slots - 1), vocab)
    out = verify(
        logits.reshape(size * slots, vocab),
        drafts.reshape(-1),
        layout,
        draft_probs=rows,
        requests=sampling.requests.at(positions),
        method=method,
    )
    return out.token_ids, out.num_emitted


def tree_step(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    draft_probs: torch.Tensor | None,
    sampling: SamplingState,
    positions: torch.Tensor,
    *,
    tree: DraftTree,
    method: str,
) -> TreeVerifyResult:
    """Verify a token tree per sequence: greedy rows follow the target's argmax down it.

    Parameters
    ----------
    logits : torch.Tensor
        ``[batch, N + 1, vocab]`` the target's logits after every node (node 0: the last
        committed token).
    tokens : torch.Tensor
        ``[batch, N + 1]`` int64 the nodes' tokens.
    draft_probs : torch.Tensor or None
        ``[batch, N + 1, vocab]`` row ``i`` the distribution node ``i``'s children were
        drawn from (``None`` in an all-greedy batch).
    sampling : SamplingState
        The parameters and random sources of the ``batch`` sequences.
    positions : torch.Tensor
        ``[batch]`` int64 absolute position of each sequence's first draft.
    tree : DraftTree
        The tree drafted (its ``parents``, drafting and bounds), built once for the run.
    method : str
        ``"traversal"`` or a tree rule of :func:`specsample.methods.tree_methods`.

    Returns
    -------
    TreeVerifyResult
        The emitted tokens, their count and the accepted path of every sequence.
    """
    return verify_tree(
        logits,
        tokens,
        tree,
        draft_probs=draft_probs,
        requests=sampling.requests.at(positions),
        method=method,
    )
