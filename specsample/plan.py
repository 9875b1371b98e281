"""A planned step, as the pipeline hands it to a backend: what to compute, not how.

:class:`Plan` is what planning a step on flattened logits produces (the layout, each target
row's statistics, the greedy requests and the uniforms); :class:`LogitsStep` is a whole chain
or block step for a backend: the rows, the drafts, the plan and the rule; :class:`TreeStep`
is a tree step. Backends (:mod:`specsample.backends`, :mod:`specsample.kernels`) take one
step object and return what it emits.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specsample.params import DraftTree, Requests
from specsample.params.layout import BatchLayout
from specsample.probs import RowNorms


class Plan(NamedTuple):
    """A planned verification step on flattened target logits.

    Attributes
    ----------
    layout : BatchLayout
        The ragged layout.
    norms : RowNorms
        ``[rows]`` statistics of the processed target rows (``log_norm`` may be NaN where
        only greedy requests read the row).
    greedy : torch.Tensor
        ``[batch]`` bool greedy requests.
    uniforms : torch.Tensor or None
        ``[batch, max_drafts + 1]`` float64 uniforms, the accept tests then the final draw
        (:func:`specsample.uniforms.step_uniforms`); ``None`` when every request is greedy.
    keys : torch.Tensor or None
        ``[rows]`` int64 row keys of the keyed Gumbel noise (:mod:`specsample.noise`), one
        per target row, for ``method="gumbel"`` (which draws no uniforms); ``None`` for the
        other methods, and when every request is greedy.
    """

    layout: BatchLayout
    norms: RowNorms
    greedy: torch.Tensor
    uniforms: torch.Tensor | None
    keys: torch.Tensor | None = None


class LogitsStep(NamedTuple):
    """A chain or block step on flattened logits, planned: what a backend executes.

    Attributes
    ----------
    target_logits : torch.Tensor
        ``[total_drafts + batch, vocab]`` target logits, request after request (its draft
        rows, then its bonus row; the draft rows only with ``bonus_token_ids``).
    draft_token_ids : torch.Tensor
        ``[total_drafts]`` int64 or int32 drafts.
    plan : Plan
        The layout, row statistics, greedy requests and uniforms.
    method : str
        ``"chain"``, ``"block"`` (which needs draft rows when a request samples) or
        ``"gumbel"`` (which reads no draft rows; its plan holds ``keys``).
    draft_probs, draft_logits : torch.Tensor or None
        ``[total_drafts, vocab]`` draft rows; neither means one-hot drafts.
    bonus_token_ids : torch.Tensor or None
        ``[batch]`` int64 tokens a request emits when all its drafts are accepted.
    """

    target_logits: torch.Tensor
    draft_token_ids: torch.Tensor
    plan: Plan
    method: str = "chain"
    draft_probs: torch.Tensor | None = None
    draft_logits: torch.Tensor | None = None
    bonus_token_ids: torch.Tensor | None = None


class TreeStep(NamedTuple):
    """A tree step: what a backend's tree slot executes.

    Attributes
    ----------
    target_logits : torch.Tensor
        ``[batch, nodes, vocab]``: row ``i`` is the target's logits after node ``i``.
    draft_token_ids : torch.Tensor
        ``[batch, nodes]`` int64 node tokens (node 0, the root, is not a draft).
    tree : DraftTree
        The parents, the drafting mode and the loop bounds.
    requests : Requests
        ``[batch]`` sampling parameters, random sources and positions; the rows are
        processed with them (greedy rows become one-hot).
    method : str
        A tree method of :func:`specsample.methods.tree_methods`, exact for the drafting.
    draft_probs : torch.Tensor or None
        ``[batch, nodes, vocab]`` the distributions the children were drawn from.
    uniforms : torch.Tensor or None
        The step's uniforms in the rule's layout, instead of drawing them.
    strict : bool
        Also check values (synchronises).
    """

    target_logits: torch.Tensor
    draft_token_ids: torch.Tensor
    tree: DraftTree
    requests: Requests
    method: str
    draft_probs: torch.Tensor | None = None
    uniforms: torch.Tensor | None = None
    strict: bool = False
