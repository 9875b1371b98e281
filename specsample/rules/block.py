"""Block verification of a chain of drafts (Sun et al. 2024, arXiv 2403.10444).

Exact, and never accepts fewer tokens in expectation than token-by-token verification: it
looks at the whole block of drafts before deciding. With ``q`` the target rows, ``p`` the
draft rows and drafts ``x_1 .. x_k``:

* weights ``w_0 = 1`` and ``w_i = min(1, w_{i-1} q_{i-1}(x_i) / p_{i-1}(x_i))``;
* residual masses ``Z_i = sum_x max(w_i q_i(x) - p_i(x), 0)``, read from the rows *after*
  ``x_i`` (row ``i``, the one that predicts ``x_{i+1}``);
* ``h_i = Z_i / (Z_i + 1 - w_i)`` for ``i < k`` and ``h_k = w_k``;
* with ``eta_i ~ U[0, 1)``, the accepted length is the **last** ``i`` with ``eta_i < h_i``
  (not the position before the first failure), 0 if there is none;
* the token after the accepted drafts is the bonus token when all ``k`` are accepted, else a
  draw from ``normalize(max(w_tau q_tau - p_tau, 0))`` at row ``tau``.

Every ``Z_i`` needs a full pass over row ``i``, so block verification reads all ``k``
positions (token-by-token verification reads one row per sequence). ``h_i = 0 / 0``
(``w_i = 1`` and ``Z_i = 0``) is taken as 0, as is every ``h`` past an invalid draft.

It needs real draft rows: with one-hot drafts (a drafter without probabilities) it accepts
exactly as many tokens in expectation as token-by-token verification, so it is refused there.
"""

from __future__ import annotations

import torch

from specsample.rules.chain import ChainStep, Drafts, ReferenceRule, VerifyResult, emit
from specsample.rules.residual import block_masses, sample_residual
from specsample.rules.rows import PositionRows, Selection


def block_weights(q_at: torch.Tensor, p_at: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """The weights ``w_0 .. w_k`` of block verification.

    Parameters
    ----------
    q_at, p_at : torch.Tensor
        ``[batch, k]`` float64 target and draft probabilities of the drafts.
    valid : torch.Tensor
        ``[batch, k]`` bool; an invalid draft (outside the vocabulary, or padding) gets
        weight 0, and so does every position after it.

    Returns
    -------
    torch.Tensor
        ``[batch, k + 1]`` float64, ``w_0 = 1``.

    Examples
    --------
    >>> import torch
    >>> q = torch.tensor([[1 / 3, 1 / 3]], dtype=torch.float64)
    >>> p = torch.tensor([[2 / 3, 2 / 3]], dtype=torch.float64)
    >>> block_weights(q, p, torch.ones(1, 2, dtype=torch.bool)).tolist()
    [[1.0, 0.5, 0.25]]
    """
    ratio = torch.where(p_at > 0, q_at / p_at, torch.where(q_at > 0, torch.inf, 0.0))
    ratio = torch.where(valid, ratio, 0.0)
    weights = [torch.ones_like(ratio[:, 0])]
    for i in range(ratio.shape[1]):
        weights.append(torch.clamp(weights[-1] * ratio[:, i], max=1.0))
    return torch.stack(weights, dim=1)


def block_length(
    weights: torch.Tensor, residual_mass: torch.Tensor, num_drafts: torch.Tensor, eta: torch.Tensor
) -> torch.Tensor:
    """The accepted length ``tau``: the last ``i`` with ``eta_i < h_i``.

    ``h_i`` is 0 wherever ``w_i = 0`` (past an invalid draft), and ``h_i = 0`` never passes.

    Parameters
    ----------
    weights : torch.Tensor
        ``[batch, k + 1]`` float64 from :func:`block_weights`.
    residual_mass : torch.Tensor
        ``[batch, k]`` float64 ``Z_i`` at row ``i`` (``Z_0`` is not used).
    num_drafts : torch.Tensor
        ``[batch]`` int64 drafts of each row (``<= k``); ``h`` is 0 past it.
    eta : torch.Tensor
        ``[batch, k]`` float64 uniforms ``eta_1 .. eta_k``.

    Returns
    -------
    torch.Tensor
        ``[batch]`` int64 in ``[0, num_drafts]``.

    Examples
    --------
    >>> import torch
    >>> w = torch.tensor([[1.0, 0.5, 0.25]], dtype=torch.float64)
    >>> z = torch.tensor([[0.0, 0.25]], dtype=torch.float64)
    >>> eta = torch.tensor([[0.9, 0.2]], dtype=torch.float64)
    >>> block_length(w, z, torch.tensor([2]), eta).tolist()
    [2]
    """
    k = eta.shape[1]
    position = torch.arange(1, k + 1, device=eta.device)
    shifted = torch.cat([residual_mass[:, 1:], torch.zeros_like(residual_mass[:, :1])], dim=1)
    w = weights[:, 1:]
    denominator = shifted + 1.0 - w
    h = torch.where(denominator > 0, shifted / denominator, 0.0)
    last = position == num_drafts.unsqueeze(-1)
    h = torch.where(last, w, torch.where(position < num_drafts.unsqueeze(-1), h, 0.0))
    h = torch.where(w > 0, h, 0.0)
    passed = position * ((h > 0) & (eta < h))
    return passed.amax(dim=1) if k else torch.zeros_like(num_drafts)


def residual_mass_per_position(
    target: Selection,
    draft: Selection,
    weights: torch.Tensor,
    vocab: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block masses of ``max(w_i q_i - p_i, 0)`` at every draft position.

    ``target`` and ``draft`` select the ``batch * k`` rows in ``(sequence, position)`` order.
    Returns the masses ``[2, batch, k, blocks]`` (see
    :func:`specsample.rules.residual.block_masses`) and ``Z [batch, k]`` in float64.
    """
    batch, k = weights.shape[0], weights.shape[1] - 1
    masses = block_masses(
        target, vocab, draft=draft, target_scale=weights[:, :k].reshape(-1).to(torch.float32)
    )
    masses = masses.view(2, batch, k, masses.shape[-1])
    return masses, masses[1].sum(dim=-1, dtype=torch.float64)


class BlockRule(ReferenceRule):
    """Verify a chain of ``k`` drafts per sequence by block verification.

    :data:`block_verify` is the rule. Same arguments, result and checks as
    :data:`specsample.rules.chain.chain_verify`; the ``k`` uniforms are the ``eta_i``, the
    last one draws the residual.

    Examples
    --------
    >>> import torch
    >>> q = torch.tensor([[[1 / 3, 2 / 3], [1 / 3, 2 / 3]]])
    >>> p = torch.tensor([[[2 / 3, 1 / 3], [2 / 3, 1 / 3]]])
    >>> u = torch.tensor([[0.9, 0.1, 0.5]], dtype=torch.float64)
    >>> out = block_verify(q, p, torch.tensor([[0, 0]]), torch.tensor([1]), u)
    >>> out.token_ids, out.num_accepted
    (tensor([[0, 0, 1]]), tensor([2]))
    """

    def verify_drafts(self, step: ChainStep, drafts: Drafts) -> VerifyResult:
        """Block verification of ``step``."""
        target_probs, draft_probs, _, _, uniforms = step
        batch, k, vocab = target_probs.shape
        ids, bonus = drafts.ids, drafts.bonus
        weights = block_weights(drafts.q_at, drafts.p_at, drafts.valid)

        target, draft = PositionRows(target_probs), PositionRows(draft_probs)
        positions = torch.arange(k, device=ids.device)
        batch_index = torch.arange(batch, device=ids.device).unsqueeze(-1)
        masses, residual = residual_mass_per_position(
            target.at(batch_index, positions), draft.at(batch_index, positions), weights, vocab
        )
        full = torch.full_like(bonus, k)
        tau = block_length(weights, residual, full, uniforms[:, :k])
        at = tau.clamp(max=k - 1)
        shape = (2, batch, 1, masses.shape[-1])
        row_masses = masses.gather(2, at.view(1, batch, 1, 1).expand(shape))
        batch_flat = batch_index.squeeze(-1)
        drawn = sample_residual(
            target.at(batch_flat, at),
            uniforms[:, -1],
            vocab,
            draft=draft.at(batch_flat, at),
            target_scale=weights.gather(1, at.unsqueeze(-1)).squeeze(-1).to(torch.float32),
            masses=row_masses.squeeze(2),
        )
        last = torch.where(tau == k, bonus, drawn)
        return VerifyResult(emit(ids, tau, last), tau)


block_verify = BlockRule()
"""Block verification of a chain of drafts (:class:`BlockRule`)."""
