"""Typical acceptance (Medusa): a LOSSY, opt-in verification rule for a chain of drafts.

.. warning::

   **This rule is NOT exact.** The tokens it emits do NOT follow the target distribution.
   A draft is accepted by a deterministic threshold on its target probability, never
   compared with the probability the drafter gave it, and every correction token is the
   target's argmax instead of a draw. The output therefore has lower entropy than the
   target: probable tokens are over-represented, improbable ones under-represented or never
   produced, and how much depends on the drafter (high-entropy rows admit more drafts).
   Use it only when that trade of fidelity for speed is wanted and stated; every exact rule
   of this library (:mod:`specsample.rules.chain`, :mod:`specsample.rules.tree`) is
   preferable whenever the output must be a sample of the target. Quantify the distortion
   with :func:`typical_first_token_distribution` and :func:`typical_first_token_tv` before
   relying on it.

The rule (Cai et al., "Medusa", 2024). At draft position ``j`` with target row ``q_j`` the
draft ``x_j`` is accepted iff::

    q_j(x_j) > min(posterior_threshold, posterior_alpha * exp(-H(q_j)))

with ``H(q) = -sum_x q(x) log q(x)`` the entropy in nats (``0 log 0 = 0``; Medusa's own code
adds ``1e-5`` inside the logarithm, a negligible difference), ``posterior_threshold = 0.09``
and ``posterior_alpha = 0.3`` by default. The accepted drafts are the longest accepted
prefix; the token after them is the argmax of the target row at the first failed position,
or of the bonus row when every draft passed.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from specsample.rules.chain import count_accepted, emit

DEFAULT_POSTERIOR_THRESHOLD = 0.09
"""Medusa's default ``posterior_threshold`` (``epsilon``)."""

DEFAULT_POSTERIOR_ALPHA = 0.3
"""Medusa's default ``posterior_alpha`` (``delta``, about ``sqrt(epsilon)``)."""


class TypicalResult(NamedTuple):
    """What :func:`typical_acceptance` produced (NOT a sample of the target).

    Attributes
    ----------
    token_ids : torch.Tensor
        ``[batch, k + 1]`` int64: the accepted drafts, the argmax correction (or bonus
        argmax), then ``-1`` padding.
    num_accepted : torch.Tensor
        ``[batch]`` int64: drafts accepted; ``num_accepted + 1`` tokens are emitted.
    """

    token_ids: torch.Tensor
    num_accepted: torch.Tensor


def check_parameters(posterior_threshold: float, posterior_alpha: float) -> None:
    """Raise ``TypeError``/``ValueError`` naming a parameter that is not a finite float >= 0."""
    for name, value in (
        ("posterior_threshold", posterior_threshold),
        ("posterior_alpha", posterior_alpha),
    ):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{name} must be a float, got {type(value).__name__}")
        if not (math.isfinite(value) and value >= 0.0):
            raise ValueError(f"{name} must be finite and >= 0, got {value}")


def _probs(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not value.dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating tensor, got {value.dtype}")
    if value.dim() < 1 or value.shape[-1] < 1:
        raise ValueError(f"{name} must have a non-empty last (vocab) dimension")
    return value


def _work(probs: torch.Tensor) -> torch.Tensor:
    return probs.to(torch.float64 if probs.dtype == torch.float64 else torch.float32)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each row of ``probs [..., vocab]``, with ``0 log 0 = 0``.

    Computed in float64 for float64 input, in float32 otherwise.

    Examples
    --------
    >>> import torch
    >>> entropy(torch.tensor([[0.5, 0.5, 0.0], [1.0, 0.0, 0.0]]))
    tensor([0.6931, 0.0000])
    """
    probs = _work(_probs("probs", probs))
    return (0.0 - torch.special.xlogy(probs, probs).sum(dim=-1)).clamp(min=0.0)


def typical_threshold(
    target_probs: torch.Tensor,
    posterior_threshold: float = DEFAULT_POSTERIOR_THRESHOLD,
    posterior_alpha: float = DEFAULT_POSTERIOR_ALPHA,
) -> torch.Tensor:
    """The acceptance threshold ``min(posterior_threshold, posterior_alpha * exp(-H(q)))``.

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[..., vocab]`` target rows ``q``.
    posterior_threshold, posterior_alpha : float
        The rule's parameters (defaults 0.09 and 0.3).

    Returns
    -------
    torch.Tensor
        ``[...]`` thresholds; a draft ``x`` passes iff ``q(x)`` is strictly above.

    Examples
    --------
    >>> import torch
    >>> typical_threshold(torch.tensor([[1.0, 0.0], [0.25, 0.75]]))
    tensor([0.0900, 0.0900])
    >>> typical_threshold(torch.full((1, 4), 0.25))
    tensor([0.0750])
    """
    check_parameters(posterior_threshold, posterior_alpha)
    h = entropy(target_probs)
    return torch.clamp(posterior_alpha * torch.exp(-h), max=posterior_threshold)


def typical_acceptance(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    *,
    bonus_token_ids: torch.Tensor | None = None,
    posterior_threshold: float = DEFAULT_POSTERIOR_THRESHOLD,
    posterior_alpha: float = DEFAULT_POSTERIOR_ALPHA,
) -> TypicalResult:
    """Medusa typical acceptance of a chain of drafts. LOSSY: NOT a sample of the target.

    See the module documentation for why the output is biased; opt in knowingly.

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[batch, k + 1, vocab]`` target probabilities: the ``k`` draft positions, then the
        bonus position. With ``bonus_token_ids``: ``[batch, k, vocab]``, the draft
        positions only.
    draft_token_ids : torch.Tensor
        ``[batch, k]`` integer drafts; ids outside ``[0, vocab)`` are rejected.
    bonus_token_ids : torch.Tensor, optional
        ``[batch, 1]`` or ``[batch]`` int64 tokens emitted when every draft passes (instead
        of the argmax of the bonus row).
    posterior_threshold, posterior_alpha : float
        The rule's parameters (Medusa's defaults 0.09 and 0.3).

    Returns
    -------
    TypicalResult
        ``token_ids [batch, k + 1]`` and ``num_accepted [batch]``.

    Examples
    --------
    >>> import torch
    >>> q = torch.tensor([[[0.05, 0.15, 0.8], [0.02, 0.9, 0.08], [0.1, 0.2, 0.7]]])
    >>> out = typical_acceptance(q, torch.tensor([[1, 2]]))
    >>> out.token_ids.tolist(), out.num_accepted.tolist()
    ([[1, 1, -1]], [1])
    """
    target_probs = _probs("target_probs", target_probs)
    if not isinstance(draft_token_ids, torch.Tensor):
        raise TypeError(
            f"draft_token_ids must be a torch.Tensor, got {type(draft_token_ids).__name__}"
        )
    if target_probs.dim() != 3:
        raise ValueError(
            f"target_probs must have shape [batch, k + 1, vocab], got {tuple(target_probs.shape)}"
        )
    batch, width, vocab = target_probs.shape
    k = width if bonus_token_ids is not None else width - 1
    if draft_token_ids.dtype.is_floating_point or draft_token_ids.dtype == torch.bool:
        raise TypeError(f"draft_token_ids must be an integer tensor, got {draft_token_ids.dtype}")
    if draft_token_ids.shape != (batch, k):
        raise ValueError(
            f"draft_token_ids must have shape {(batch, k)}, got {tuple(draft_token_ids.shape)}"
        )
    check_parameters(posterior_threshold, posterior_alpha)
    ids = draft_token_ids.to(device=target_probs.device, dtype=torch.int64)
    best = target_probs.argmax(dim=-1)
    if bonus_token_ids is not None:
        bonus = bonus_token_ids.reshape(batch, 1).to(device=ids.device, dtype=torch.int64)
        best = torch.cat([best, bonus], dim=1)
    if k == 0:
        return TypicalResult(best, torch.zeros(batch, dtype=torch.int64, device=ids.device))
    rows = _work(target_probs[:, :k])
    threshold = typical_threshold(rows, posterior_threshold, posterior_alpha)
    in_vocab = (ids >= 0) & (ids < vocab)
    q_at = rows.gather(2, ids.clamp(0, vocab - 1).unsqueeze(-1)).squeeze(-1)
    num_accepted = count_accepted((q_at > threshold) & in_vocab)
    last = best.gather(1, num_accepted.unsqueeze(-1)).squeeze(-1)
    return TypicalResult(emit(ids, num_accepted, last), num_accepted)


def typical_first_token_distribution(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    *,
    posterior_threshold: float = DEFAULT_POSTERIOR_THRESHOLD,
    posterior_alpha: float = DEFAULT_POSTERIOR_ALPHA,
) -> torch.Tensor:
    """Exact law of the first token typical acceptance emits, per row.

    With the draft ``x ~ p`` and the target row ``q``, the first token is ``x`` when
    ``q(x)`` passes the threshold and ``argmax q`` otherwise::

        P(y) = p(y) [q(y) > t] + [y = argmax q] * sum_x p(x) [q(x) <= t]

    An exact rule would give ``P = q``. For a deterministic drafter pass a one-hot ``p``.

    Parameters
    ----------
    target_probs, draft_probs : torch.Tensor
        ``[..., vocab]`` target rows ``q`` and draft rows ``p`` (same shape).
    posterior_threshold, posterior_alpha : float
        The rule's parameters.

    Returns
    -------
    torch.Tensor
        ``[..., vocab]`` float64 probabilities.

    Examples
    --------
    >>> import torch
    >>> q = torch.tensor([0.05, 0.15, 0.8], dtype=torch.float64)
    >>> typical_first_token_distribution(q, torch.full((3,), 1 / 3, dtype=torch.float64))
    tensor([0.0000, 0.3333, 0.6667], dtype=torch.float64)
    """
    q = _probs("target_probs", target_probs).to(torch.float64)
    p = _probs("draft_probs", draft_probs).to(torch.float64)
    if p.shape != q.shape:
        raise ValueError(
            f"draft_probs must have the shape of target_probs {tuple(q.shape)}, "
            f"got {tuple(p.shape)}"
        )
    threshold = typical_threshold(q, posterior_threshold, posterior_alpha).unsqueeze(-1)
    passes = q > threshold
    kept = torch.where(passes, p, 0.0)
    failed = torch.where(passes, 0.0, p).sum(dim=-1, keepdim=True)
    argmax = torch.nn.functional.one_hot(q.argmax(dim=-1), q.shape[-1]).to(torch.float64)
    return kept + failed * argmax


def typical_first_token_tv(target_probs: torch.Tensor, law: torch.Tensor) -> torch.Tensor:
    """Exact total variation between typical acceptance's first token and the target.

    ``TV = 1/2 sum_y |P(y) - q(y)|`` with ``P`` the law
    :func:`typical_first_token_distribution` gives; an exact rule has ``TV = 0``. The target
    rows should be normalised.

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[..., vocab]`` target rows ``q``.
    law : torch.Tensor
        ``[..., vocab]`` the first token's law ``P`` on the same rows.

    Returns
    -------
    torch.Tensor
        ``[...]`` float64 total-variation distances in ``[0, 1]``.

    Examples
    --------
    >>> import torch
    >>> q = torch.tensor([0.05, 0.15, 0.8], dtype=torch.float64)
    >>> law = typical_first_token_distribution(q, torch.full((3,), 1 / 3, dtype=torch.float64))
    >>> round(float(typical_first_token_tv(q, law)), 4)
    0.1833
    """
    q = _probs("target_probs", target_probs).to(torch.float64)
    law = _probs("law", law).to(torch.float64)
    if law.shape != q.shape:
        raise ValueError(
            f"law must have the shape of target_probs {tuple(q.shape)}, got {tuple(law.shape)}"
        )
    return 0.5 * (law - q).abs().sum(dim=-1)
