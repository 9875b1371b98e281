"""Types and constants every layer shares: results, the vocabulary block, row views.

The rules (:mod:`specsample.rules`), the backends, the kernels and the public API all speak
of a step's result and read rows the same way; these live here, below all of them, so that
no layer imports another sideways for them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import NamedTuple

import torch

from specsample.uniforms import in_step_order

BLOCK = 1024
"""Tokens per vocabulary block of the two-level inverse CDF (rules and kernels alike)."""


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

    def run_drawn(self, step: ChainStep) -> VerifyResult:
        """:meth:`run` on a ``step`` whose uniforms are in the order they were drawn (the
        final draw first, :func:`specsample.uniforms.drawn_uniforms`). This puts them in step
        order; a rule that reads them in place overrides it."""
        return self.run(step._replace(uniforms=in_step_order(step.uniforms)))


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


def flat_rows(probs: torch.Tensor) -> tuple[torch.Tensor, int]:
    """View ``[batch, k, vocab]`` as ``[rows, vocab]`` without copying where strides allow.

    Returns the 2-D view and the row stride of the batch dimension, so that the row of
    ``(b, j)`` is ``b * stride + j``. A tensor whose layout admits no such view (its last
    dimension not contiguous, say) is copied once.

    Examples
    --------
    >>> import torch
    >>> x = torch.arange(24.0).view(2, 4, 3)[:, :3]
    >>> flat, stride = flat_rows(x)
    >>> stride, bool(torch.equal(flat[1 * stride + 2], x[1, 2]))
    (4, True)
    """
    batch, k, vocab = probs.shape
    s0, s1, s2 = probs.stride()
    if s2 != 1 or s1 < vocab or s1 == 0 or s0 % s1 != 0:
        probs = probs.contiguous()
        s0, s1 = probs.stride()[0], probs.stride()[1]
    stride = s0 // s1 if batch > 1 else k
    rows = (batch - 1) * stride + k if batch > 0 else 0
    return probs.as_strided((rows, vocab), (s1, 1)), stride


def unit_columns(rows: torch.Tensor) -> torch.Tensor:
    """``rows [..., vocab]`` with unit column stride, copied only when it has another one.

    The row readers index columns by offset, so every entry point hands them rows whose
    last dimension is contiguous; any row stride is kept.

    Examples
    --------
    >>> import torch
    >>> x = torch.arange(6.0).view(2, 3).t()
    >>> x.stride(), unit_columns(x).stride()
    ((1, 3), (2, 1))
    """
    if rows.dim() == 0 or rows.stride(-1) == 1 or rows.shape[-1] <= 1:
        return rows
    return rows.contiguous()
