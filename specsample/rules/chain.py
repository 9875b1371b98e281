"""Token-by-token speculative sampling of a chain of drafts (Leviathan et al.; Chen et al.).

Notation follows the rest of the library: ``q`` is the target distribution, ``p`` the draft
distribution the drafts were sampled from. Draft ``x_i`` is accepted when
``u_i * p_i(x_i) < q_i(x_i)`` with ``u_i ~ U[0, 1)`` (no division, so ``p_i(x_i) = 0`` is
harmless); the first rejected position emits a token from ``normalize(max(0, q - p))``
(see :mod:`specsample.rules.residual`); when all ``k`` drafts pass, the bonus token is
emitted. The emitted stream then follows ``q`` exactly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import torch

from specsample.params.checks import check_chain_inputs, check_step_uniforms, require_tensor
from specsample.rules.residual import sample_residual
from specsample.rules.rows import PositionRows


class VerifyResult(NamedTuple):
    """What a verification step produced.

    Attributes
    ----------
    token_ids : torch.Tensor
        ``[batch, k + 1]`` int64: the accepted drafts, then one more token (the residual draw
        at the first rejection, or the bonus token), then ``-1`` padding.
    num_accepted : torch.Tensor
        ``[batch]`` int64: drafts accepted in order; ``num_accepted + 1`` tokens are emitted.
    """

    token_ids: torch.Tensor
    num_accepted: torch.Tensor


class ChainStep(NamedTuple):
    """The arguments of a padded chain rule (:class:`PaddedRule`) as one value."""

    target_probs: torch.Tensor
    draft_probs: torch.Tensor
    draft_token_ids: torch.Tensor
    bonus_token_ids: torch.Tensor
    uniforms: torch.Tensor

    def bonus_only(self) -> VerifyResult:
        """The result of a step without drafts (``k = 0``): the bonus token alone."""
        bonus = self.bonus_token_ids.reshape(self.target_probs.shape[0]).to(torch.int64)
        return VerifyResult(bonus.unsqueeze(-1), torch.zeros_like(bonus))


class PaddedRule(ABC):
    """A rule verifying a chain of ``k`` drafts per sequence from ``[batch, k, vocab]`` rows.

    Every such rule, whether the reference rules of :mod:`specsample.rules` or the kernels
    of :mod:`specsample.kernels`, is called with the same arguments (:meth:`__call__`) and
    implements :meth:`verify` on them as one :class:`ChainStep`.
    """

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def __call__(
        self,
        target_probs: torch.Tensor,
        draft_probs: torch.Tensor,
        draft_token_ids: torch.Tensor,
        bonus_token_ids: torch.Tensor,
        uniforms: torch.Tensor,
    ) -> VerifyResult:
        """Verify a chain of ``k`` drafts per sequence by the rule.

        Parameters
        ----------
        target_probs : torch.Tensor
            ``[batch, k, vocab]`` target probabilities ``q`` at each draft position.
        draft_probs : torch.Tensor
            ``[batch, k, vocab]`` the draft distributions ``p`` the drafts were sampled from.
        draft_token_ids : torch.Tensor
            ``[batch, k]`` drafts. Ids outside ``[0, vocab)`` (such as ``-1`` placeholders)
            are always rejected.
        bonus_token_ids : torch.Tensor
            ``[batch]`` or ``[batch, 1]`` int64, emitted when all ``k`` drafts are accepted.
        uniforms : torch.Tensor
            ``[batch, k + 1]`` float64 in ``[0, 1)``: one per accept test, then one for the
            residual draw.

        Returns
        -------
        VerifyResult
            ``token_ids [batch, k + 1]`` int64 and ``num_accepted [batch]`` int64.
        """
        return self.verify(
            ChainStep(target_probs, draft_probs, draft_token_ids, bonus_token_ids, uniforms)
        )

    @abstractmethod
    def verify(self, step: ChainStep) -> VerifyResult:
        """The rule's result on the arguments ``step`` (see :meth:`__call__`)."""

    def run(self, step: ChainStep) -> VerifyResult:
        """The rule's result on a ``step`` whose arguments the caller has already checked
        (as :func:`specsample.rules.chain.check_rule_inputs` does): :meth:`verify` without
        repeating the checks, where a rule can skip them."""
        return self.verify(step)


def emit(
    draft_token_ids: torch.Tensor, num_accepted: torch.Tensor, last: torch.Tensor
) -> torch.Tensor:
    """Lay out ``[batch, k + 1]`` output: accepted drafts, ``last``, then ``-1``.

    Parameters
    ----------
    draft_token_ids : torch.Tensor
        ``[batch, k]`` int64 drafts.
    num_accepted : torch.Tensor
        ``[batch]`` int64 in ``[0, k]``.
    last : torch.Tensor
        ``[batch]`` int64, the token written at column ``num_accepted``.

    Examples
    --------
    >>> import torch
    >>> emit(torch.tensor([[4, 5, 6]]), torch.tensor([1]), torch.tensor([9]))
    tensor([[ 4,  9, -1, -1]])
    """
    batch, k = draft_token_ids.shape
    cols = torch.arange(k, device=draft_token_ids.device)
    kept = torch.where(cols < num_accepted.unsqueeze(-1), draft_token_ids, -1)
    out = torch.cat([kept, kept.new_full((batch, 1), -1)], dim=1)
    return out.scatter_(1, num_accepted.unsqueeze(-1), last.unsqueeze(-1))


def count_accepted(accepted: torch.Tensor) -> torch.Tensor:
    """Length of the leading run of ``True`` in each row of ``accepted [batch, k]``."""
    return accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)


class Drafts(NamedTuple):
    """A padded step's drafts and their probabilities (see :func:`gather_drafts`)."""

    ids: torch.Tensor
    bonus: torch.Tensor
    valid: torch.Tensor
    q_at: torch.Tensor
    p_at: torch.Tensor


def gather_drafts(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    bonus_token_ids: torch.Tensor,
) -> Drafts:
    """Drafts as int64, which are valid, and ``q`` and ``p`` at each draft (float64).

    Parameters
    ----------
    target_probs, draft_probs : torch.Tensor
        ``[batch, k, vocab]``.
    draft_token_ids : torch.Tensor
        ``[batch, k]``; ids outside ``[0, vocab)`` are invalid (probabilities read at a
        clamped id).
    bonus_token_ids : torch.Tensor
        ``[batch]`` or ``[batch, 1]``.

    Examples
    --------
    >>> import torch
    >>> q = torch.tensor([[[0.25, 0.75]]])
    >>> gather_drafts(q, q, torch.tensor([[1]]), torch.tensor([0])).q_at.tolist()
    [[0.75]]
    """
    batch, _, vocab = target_probs.shape
    ids = draft_token_ids.to(torch.int64)
    safe_ids = ids.clamp(0, max(vocab - 1, 0)).unsqueeze(-1)
    return Drafts(
        ids=ids,
        bonus=bonus_token_ids.reshape(batch).to(torch.int64),
        valid=(ids >= 0) & (ids < vocab),
        q_at=target_probs.gather(2, safe_ids).squeeze(-1).to(torch.float64),
        p_at=draft_probs.gather(2, safe_ids).squeeze(-1).to(torch.float64),
    )


def check_rule_inputs(
    target_probs: object,
    draft_probs: object,
    draft_token_ids: object,
    bonus_token_ids: object,
    uniforms: object,
) -> None:
    """The shape, dtype and device checks of a rule's arguments (no synchronisation).

    Raises
    ------
    TypeError, ValueError
        Naming the argument, as :func:`specsample.params.checks.check_chain_inputs` does (and for
        ``uniforms``, ``[batch, k + 1]`` float64 on the device of ``target_probs``).

    Examples
    --------
    >>> import torch
    >>> q = torch.full((1, 1, 2), 0.5)
    >>> check_rule_inputs(q, q, torch.tensor([[0]]), torch.tensor([[1, 1]]), torch.zeros(1, 2))
    Traceback (most recent call last):
    ...
    ValueError: bonus_token_ids must have shape (1, 1) or (1,), got (1, 2)
    """
    check_chain_inputs(target_probs, bonus_token_ids, draft_probs, draft_token_ids)
    target = require_tensor("target_probs", target_probs)
    batch, k, _ = target.shape
    check_step_uniforms(uniforms, batch, k + 1, target.device)


class ReferenceRule(PaddedRule):
    """A padded chain rule of :mod:`specsample.rules`, computed from the drafts it gathers.

    :meth:`verify` checks the arguments (:func:`check_rule_inputs`); a step without drafts
    (``k = 0``) emits its bonus token, any other is verified by :meth:`verify_drafts` on the
    drafts it gathers (:func:`gather_drafts`).
    """

    def verify(self, step: ChainStep) -> VerifyResult:
        """The rule's result on ``step``."""
        check_rule_inputs(*step)
        return self.run(step)

    def run(self, step: ChainStep) -> VerifyResult:
        """The rule's result on ``step``, its arguments already checked."""
        if step.target_probs.shape[1] == 0:
            return step.bonus_only()
        return self.verify_drafts(step, gather_drafts(*step[:4]))

    @abstractmethod
    def verify_drafts(self, step: ChainStep, drafts: Drafts) -> VerifyResult:
        """The rule's result on ``step`` with ``k > 0`` drafts, gathered as ``drafts``."""


class ChainRule(ReferenceRule):
    """Verify a chain of ``k`` drafts per sequence by rejection sampling.

    :data:`chain_verify` is the rule; it is called as :meth:`PaddedRule.__call__
    <specsample.rules.chain.PaddedRule.__call__>` documents, with ``target_probs`` and
    ``draft_probs`` in float32, float16 or bfloat16 (arithmetic in float32 or float64) and
    ``draft_token_ids`` int64.

    Raises
    ------
    TypeError, ValueError
        For arguments of the wrong type, dtype, shape or device (see
        :func:`check_rule_inputs`); values are not read.

    Examples
    --------
    >>> import torch
    >>> q = torch.tensor([[[0.0, 1.0], [0.5, 0.5]]])
    >>> p = torch.tensor([[[0.5, 0.5], [0.5, 0.5]]])
    >>> u = torch.tensor([[0.3, 0.9, 0.5]], dtype=torch.float64)
    >>> chain_verify(q, p, torch.tensor([[1, 0]]), torch.tensor([1]), u).token_ids
    tensor([[1, 0, 1]])
    """

    def verify_drafts(self, step: ChainStep, drafts: Drafts) -> VerifyResult:
        """Token-by-token verification of ``step``."""
        target_probs, draft_probs, _, _, uniforms = step
        batch, k, vocab = target_probs.shape
        accepted = (uniforms[:, :k] * drafts.p_at < drafts.q_at) & drafts.valid
        num_accepted = count_accepted(accepted)
        ids, bonus = drafts.ids, drafts.bonus

        position = num_accepted.clamp(max=k - 1)
        batch_index = torch.arange(batch, device=ids.device)
        recovered = sample_residual(
            PositionRows(target_probs).at(batch_index, position),
            uniforms[:, -1],
            vocab,
            draft=PositionRows(draft_probs).at(batch_index, position),
        )
        last = torch.where(num_accepted == k, bonus, recovered)
        return VerifyResult(emit(ids, num_accepted, last), num_accepted)


chain_verify = ChainRule()
"""Token-by-token verification of a chain of drafts (:class:`ChainRule`)."""
