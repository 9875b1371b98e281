"""Exact mean tokens per verification step of the rules :mod:`specsample.testing.compare`
runs, on its toy pairs (:class:`specsample.testing.Family`).

Token-by-token and block verification take the law of the accepted length from
:meth:`specsample.testing.Family.accepted_length_law`. Keyed Gumbel-max verification
(``"gumbel"``, drafts drawn with the same noise) accepts a draft when both argmaxes agree, which
at a row happens on token ``x`` with probability ``1 / sum_y max(p(y) / p(x), q(y) / q(x))``
(:func:`gumbel_agreement`). On trees of i.i.d. children
(``branching`` per node, ``k`` levels, drafted from the draft rows) the top-down rule for
i.i.d. drafting (MSS) and traversal verification follow from recursions over the tree's levels,
which hold because with i.i.d. children the state of a node after a rejected child does not
depend on that child's token: for MSS every level is then a closed form; traversal's
recursion evaluates ``(branching * vocab) ** k`` weights, at most
:data:`TREE_RECURSION_LIMIT`.
"""

from __future__ import annotations

import math

import torch

from specsample.methods import chain_methods, tree_method
from specsample.testing.families import BLOCK_ENUMERATION_LIMIT, Family

GUMBEL_RATIO_LIMIT = 1 << 28
"""Most ``k * vocab**3`` ratios the exact value of keyed Gumbel-max verification computes
(``vocab <= 322`` at ``k = 8``), in blocks of at most ``2**22``."""

TREE_RECURSION_LIMIT = 1 << 22
"""Most ``(branching * vocab) ** k`` (weights at the deepest level) of the recursion that gives
the exact value of traversal (``k <= 5`` at the default ``vocab = 8``, ``branching = 2``)."""


def _exact_rows(family: Family) -> tuple[torch.Tensor, torch.Tensor]:
    """The target ``[k + 1, vocab, vocab]`` and draft ``[k, vocab, vocab]`` rows in float64."""
    draft = family.draft.to(torch.float64)
    return family.reference(), draft / draft.sum(dim=-1, keepdim=True)


def gumbel_agreement(target: torch.Tensor, draft: torch.Tensor) -> torch.Tensor:
    """``[..., vocab]`` the probability that keyed Gumbel-max picks token ``x`` in both rows.

    With shared noise ``g``, ``argmax log q + g`` and ``argmax log p + g`` are both ``x``
    exactly when ``g_y - g_x < -log max(p(y) / p(x), q(y) / q(x))`` for every ``y``: a
    Gumbel-max race of weights ``max(...)``, won by ``x`` (weight 1) with probability
    ``1 / sum_y max(p(y) / p(x), q(y) / q(x))`` (0 where ``p(x) q(x) = 0``). Its sum over
    ``x`` is at least ``(1 - TV) / (1 + TV)`` (Daliri, Musco and Suresh).

    Parameters
    ----------
    target, draft : torch.Tensor
        ``[..., vocab]`` distributions ``q`` and ``p``.

    Examples
    --------
    >>> q = torch.tensor([0.5, 0.5], dtype=torch.float64)
    >>> gumbel_agreement(q, q).tolist()
    [0.5, 0.5]
    """
    q, p = target.to(torch.float64), draft.to(torch.float64)
    both = (q > 0) & (p > 0)
    ratio = torch.maximum(
        q.unsqueeze(-2) / torch.where(q > 0, q, 1.0).unsqueeze(-1),
        p.unsqueeze(-2) / torch.where(p > 0, p, 1.0).unsqueeze(-1),
    )
    return torch.where(both, 1.0 / ratio.sum(dim=-1), 0.0)


def _gumbel_tokens(family: Family) -> float:
    """Exact tokens per step of keyed Gumbel-max verification of drafts drawn with the same
    noise: ``1 + sum_j P(the first j drafts agree)``, the agreeing paths carried row by row
    (``nan`` when ``k * vocab**3`` exceeds :data:`GUMBEL_RATIO_LIMIT`)."""
    vocab = family.vocab
    if family.k * vocab**3 > GUMBEL_RATIO_LIMIT:
        return math.nan
    target, draft = _exact_rows(family)
    reach = torch.zeros(vocab, dtype=torch.float64)
    reach[family.start] = 1.0
    total = 1.0
    rows = max(1, (1 << 22) // vocab**2)  # rows of [rows, vocab, vocab] ratios at a time
    for depth in range(family.k):
        agree = torch.cat(
            [
                gumbel_agreement(
                    target[depth, start : start + rows], draft[depth, start : start + rows]
                )
                for start in range(0, vocab, rows)
            ]
        )
        reach = reach @ agree
        total += float(reach.sum())
    return total


def _mss_tokens(family: Family, branching: int) -> float:
    """Exact tokens per step of MSS on the i.i.d. trees.

    ``E_d(t)``, the tokens accepted below a node of depth ``d`` and token ``t``, is 0 at depth
    ``k``; above, child ``j`` is tried after ``j`` rejections, each with probability
    ``1 - sum min(p, q_j)``, and accepted with token ``x`` with probability
    ``min(p(x), q_j(x))``, where ``q_0 = q`` and ``q_{j+1} = normalize(max(q_j - p, 0))`` does
    not depend on the rejected tokens.
    """
    target, draft = _exact_rows(family)
    below = torch.zeros(family.vocab, dtype=torch.float64)
    for depth in reversed(range(family.k)):
        q, p = target[depth], draft[depth]
        reach = torch.ones(family.vocab, dtype=torch.float64)
        total = torch.zeros(family.vocab, dtype=torch.float64)
        for _ in range(branching):
            overlap = torch.minimum(q, p)
            total = total + reach * (overlap @ (1.0 + below))
            reach = reach * (1.0 - overlap.sum(dim=-1))
            residual = (q - p).clamp(min=0.0)
            mass = residual.sum(dim=-1, keepdim=True)
            q = torch.where(mass > 0, residual / torch.where(mass > 0, mass, 1.0), q)
        below = total
    return 1.0 + float(below[family.start])


def _traversal_tokens(family: Family, branching: int) -> float:
    """Exact tokens per step of traversal on the i.i.d. trees (``nan`` when
    ``(branching * vocab) ** k`` exceeds :data:`TREE_RECURSION_LIMIT`).

    ``G_d(t, w)``, the expected tokens emitted by a step that accepts inside the subtree of a
    node of depth ``d``, token ``t`` and weight ``w``, is ``(k + 1) w`` at depth ``k``. Above,
    the node's weight and rows after ``j`` deleted children, ``(w_j, q_j)``, do not depend on
    the deleted tokens (i.i.d. children), a child's subtree is rejected with probability
    ``1 - w_c`` (the invariant of :mod:`specsample.rules.tree.traversal`), so child ``j``
    is reached with probability ``prod_{i < j} (1 - w_i + Z_i)`` and
    ``G_d(t, w) = sum_j reach_j sum_x p(x) G_{d+1}(x, w_c) + reach_b w_b (d + 1)``.
    """
    vocab, k = family.vocab, family.k
    if (branching * vocab) ** k > TREE_RECURSION_LIMIT:
        return math.nan
    target, draft = _exact_rows(family)
    tokens = torch.arange(vocab)

    def expected(depth: int, token: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        if depth == k:
            return w * (k + 1)
        q, p = target[depth, token], draft[depth, token]
        w_children, reach = [], [torch.ones_like(w)]
        for _ in range(branching):
            scaled = w.unsqueeze(-1) * q
            ratio = (scaled / torch.where(p > 0, p, 1.0)).clamp(max=1.0)
            w_children.append(torch.where(p > 0, ratio, (scaled > 0).to(torch.float64)))
            residual = (scaled - p).clamp(min=0.0)
            mass = residual.sum(dim=-1, keepdim=True)
            reach.append(reach[-1] * (1.0 - w + mass.squeeze(-1)))
            denominator = mass.squeeze(-1) + 1.0 - w
            safe = torch.where(denominator > 0, denominator, 1.0)
            rest = torch.where(denominator > 0, mass.squeeze(-1) / safe, 0.0)
            w = torch.ones_like(w) if depth == 0 else rest
            q = torch.where(mass > 0, residual / torch.where(mass > 0, mass, 1.0), q)
        stacked = torch.stack(w_children, dim=1)
        child = tokens.expand(stacked.shape).reshape(-1)
        below = expected(depth + 1, child, stacked.reshape(-1)).view(stacked.shape)
        inside = (p.unsqueeze(1) * below).sum(dim=-1)
        return (torch.stack(reach[:-1], dim=1) * inside).sum(dim=1) + reach[-1] * w * (depth + 1)

    start = torch.tensor([family.start])
    return float(expected(0, start, torch.ones(1, dtype=torch.float64))[0])


def exact_tokens_per_step(family: Family, rule: str, branching: int) -> float:
    """Exact mean tokens emitted per verification step of ``rule`` on ``family``.

    Parameters
    ----------
    family : Family
        The toy pair; ``k`` is its draft length (the depth of the trees).
    rule : str
        A name of :data:`specsample.methods.METHODS`: a chain rule verifies chains of ``k``
        drafts, a tree rule full trees of i.i.d. children.
    branching : int
        Children per tree node (unused by the chain rules).

    Returns
    -------
    float
        The expectation; ``nan`` where it is unknown (typical acceptance, the rules for other
        drafting modes) or too costly (block beyond :data:`BLOCK_ENUMERATION_LIMIT` draft
        sequences, traversal beyond :data:`TREE_RECURSION_LIMIT` weights, gumbel beyond
        :data:`GUMBEL_RATIO_LIMIT` ratios).

    Examples
    --------
    >>> from specsample.testing import make_family
    >>> family = make_family("markov", k=3, vocab=5)
    >>> chain = exact_tokens_per_step(family, "chain", 1)
    >>> abs(exact_tokens_per_step(family, "mss", 1) - chain) < 1e-12
    True
    >>> math.isnan(exact_tokens_per_step(family, "typical", 1))
    True
    """
    k = family.k
    if rule == "gumbel":
        return _gumbel_tokens(family)
    enumerable = rule != "block" or family.vocab**k <= BLOCK_ENUMERATION_LIMIT
    if rule in chain_methods() and enumerable:
        lengths = torch.arange(k + 1, dtype=torch.float64)
        return float((family.accepted_length_law(rule) * lengths).sum()) + 1.0
    if rule == tree_method("iid"):
        return _mss_tokens(family, branching)
    if rule == "traversal":
        return _traversal_tokens(family, branching)
    return math.nan
