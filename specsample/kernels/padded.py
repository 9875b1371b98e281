"""The padded probability rules by the Triton kernels: ``[batch, k, vocab]`` rows, as in
:mod:`specsample.rules`.

:func:`chain_kernel_verify` and :func:`block_kernel_verify` take the arguments and give the
result of :func:`specsample.rules.chain.chain_verify` and
:func:`specsample.rules.block.block_verify`; :func:`kernel_block_masses` runs the first of the
two kernels alone and returns the block masses the draw reads, to be compared with the
rules' own (:func:`specsample.rules.residual.block_masses`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from specsample.kernels.launch import (
    _check_device,
    _launch,
    _launch_masses,
    _Step,
    _unit_columns,
)
from specsample.shared import BLOCK, VerifyResult, flat_rows

_RULE_IDS = {"chain": 0, "block": 1}


def _padded_step(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    uniforms: torch.Tensor,
    rule: int,
) -> _Step | None:
    """Check the arguments of the padded probability rules and lay them out as a step.

    ``rule`` is 0 (chain) or 1 (block); None when ``k = 0`` (no draft to verify).
    """
    if target_probs.dim() != 3 or draft_probs.shape != target_probs.shape:
        raise ValueError(
            "target_probs and draft_probs must both have shape [batch, k, vocab], got "
            f"{tuple(target_probs.shape)} and {tuple(draft_probs.shape)}"
        )
    batch, k, vocab = target_probs.shape
    if draft_token_ids.shape != (batch, k):
        raise ValueError(f"draft_token_ids must have shape {(batch, k)}")
    if uniforms.shape != (batch, k + 1) or uniforms.dtype != torch.float64:
        raise ValueError(f"uniforms must be float64 of shape {(batch, k + 1)}")
    bonus = bonus_token_ids.reshape(batch)
    _check_device(target_probs, draft_probs, draft_token_ids, bonus, uniforms)
    if k == 0:
        return None
    target_rows, target_step = flat_rows(target_probs)
    draft_rows, draft_step = flat_rows(draft_probs)
    return _Step(
        target=_unit_columns(target_rows),
        target_stats=None,
        draft=_unit_columns(draft_rows),
        draft_stats=None,
        ids=draft_token_ids.contiguous(),
        uniforms=uniforms.contiguous(),
        layout=None,
        greedy=None,
        bonus=bonus.contiguous(),
        batch=batch,
        vocab=vocab,
        k=k,
        steps=(target_step, draft_step),
        rule=rule,
    )


def _padded(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    uniforms: torch.Tensor,
    rule: int,
) -> VerifyResult:
    """The padded probability rules (:func:`chain_kernel_verify`, :func:`block_kernel_verify`)."""
    step = _padded_step(target_probs, draft_probs, draft_token_ids, bonus_token_ids, uniforms, rule)
    if step is None:
        ids = bonus_token_ids.reshape(target_probs.shape[0]).to(torch.int64)
        return VerifyResult(ids.unsqueeze(-1), torch.zeros_like(ids))
    return VerifyResult(*_launch(step))


def chain_kernel_verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    uniforms: torch.Tensor,
) -> VerifyResult:
    """Token-by-token verification in two Triton kernels; same contract as ``chain_verify``.

    Same arguments, result and randomness as :func:`specsample.rules.chain.chain_verify`:
    given the same uniforms it emits the same tokens, up to floating-point ties (a uniform
    within rounding of a boundary of the inverse CDF). The residual is computed only at each
    sequence's first rejected position, and not at all when every draft is accepted.

    Parameters
    ----------
    target_probs, draft_probs : torch.Tensor
        ``[batch, k, vocab]`` (float32, float16, bfloat16 or float64), unit column stride
        preferred (other layouts are copied).
    draft_token_ids : torch.Tensor
        ``[batch, k]`` int64 or int32; ids outside ``[0, vocab)`` are rejected.
    bonus_token_ids : torch.Tensor
        ``[batch]`` or ``[batch, 1]``, emitted when all ``k`` drafts are accepted.
    uniforms : torch.Tensor
        ``[batch, k + 1]`` float64: the accept tests, then the residual draw.

    Returns
    -------
    VerifyResult
        ``token_ids [batch, k + 1]`` int64 and ``num_accepted [batch]`` int64.

    Raises
    ------
    RuntimeError
        Triton is missing, or the tensors are on the CPU without ``TRITON_INTERPRET=1``.

    Examples
    --------
    >>> import torch
    >>> from specsample import kernels
    >>> from specsample.rules.chain import chain_verify
    >>> q = torch.tensor([[[0.0, 1.0], [0.5, 0.5]]])
    >>> p = torch.tensor([[[0.5, 0.5], [0.5, 0.5]]])
    >>> u = torch.tensor([[0.3, 0.9, 0.5]], dtype=torch.float64)
    >>> verify = chain_kernel_verify if kernels.supports(q) else chain_verify
    >>> verify(q, p, torch.tensor([[1, 0]]), torch.tensor([1]), u).token_ids
    tensor([[1, 0, 1]])
    """
    return _padded(target_probs, draft_probs, draft_token_ids, bonus_token_ids, uniforms, 0)


def block_kernel_verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    uniforms: torch.Tensor,
) -> VerifyResult:
    """Block verification in two Triton kernels; same contract as ``block_verify``.

    Same arguments, result and randomness as :func:`specsample.rules.block.block_verify`
    (the first ``k`` uniforms are the ``eta_i``, the last draws the residual). The first
    kernel computes the block masses of ``max(w_i q_i - p_i, 0)`` at every position; the
    second the weights, the accepted length and the draw at row ``tau``.

    Parameters
    ----------
    target_probs, draft_probs : torch.Tensor
        ``[batch, k, vocab]``.
    draft_token_ids : torch.Tensor
        ``[batch, k]`` int64 or int32.
    bonus_token_ids : torch.Tensor
        ``[batch]`` or ``[batch, 1]``.
    uniforms : torch.Tensor
        ``[batch, k + 1]`` float64.

    Returns
    -------
    VerifyResult
        ``token_ids [batch, k + 1]`` int64 and ``num_accepted [batch]`` int64.

    Examples
    --------
    >>> import torch
    >>> from specsample import kernels
    >>> from specsample.rules.block import block_verify
    >>> q = torch.tensor([[[1 / 3, 2 / 3], [1 / 3, 2 / 3]]])
    >>> p = torch.tensor([[[2 / 3, 1 / 3], [2 / 3, 1 / 3]]])
    >>> u = torch.tensor([[0.9, 0.1, 0.5]], dtype=torch.float64)
    >>> verify = block_kernel_verify if kernels.supports(q) else block_verify
    >>> verify(q, p, torch.tensor([[0, 0]]), torch.tensor([1]), u).token_ids
    tensor([[0, 0, 1]])
    """
    return _padded(target_probs, draft_probs, draft_token_ids, bonus_token_ids, uniforms, 1)


def kernel_block_masses(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    uniforms: torch.Tensor,
    method: str = "chain",
) -> torch.Tensor:
    """The block masses the kernels draw the residual from, by the masses kernel alone.

    The kernel computes them as :mod:`specsample.rules.residual` does, operation by
    operation, so that they equal the rule's float32 values (exactly wherever each block's
    float32 sum is exact, as its order of summation may differ). The rows are those the rule
    reads: for ``method="chain"`` the row at each sequence's first rejected position, as
    :func:`specsample.rules.residual.block_masses` of the rows
    :func:`specsample.rules.chain.chain_verify` selects; for ``"block"`` every draft row
    ``i`` with block verification's weight ``w_i``, as the masses of
    :func:`specsample.rules.block.residual_mass_per_position`.

    Parameters
    ----------
    target_probs, draft_probs, draft_token_ids, bonus_token_ids, uniforms : torch.Tensor
        As for :func:`chain_kernel_verify` (the uniforms decide the chain's rejected row).
    method : str
        ``"chain"`` or ``"block"``.

    Returns
    -------
    torch.Tensor
        ``[2, batch, positions, blocks]`` float32, ``blocks = ceil(vocab / 1024)``: per block
        the target mass ``sum q``, then the residual mass ``sum max(w q - p, 0)``.
        ``positions`` is 1 for the chain rule (all zero for a sequence that accepts every
        draft: it draws nothing) and ``k`` for the block rule.

    Raises
    ------
    ValueError
        An unknown ``method``, or arguments that :func:`chain_kernel_verify` refuses.

    Examples
    --------
    >>> import torch
    >>> from specsample import kernels
    >>> from specsample.rules.residual import block_masses
    >>> from specsample.rules.rows import ProbRows
    >>> q, p = torch.tensor([[[0.5, 0.5]]]), torch.tensor([[[0.75, 0.25]]])
    >>> ids, bonus = torch.tensor([[0]]), torch.tensor([1])
    >>> u = torch.tensor([[0.9, 0.5]], dtype=torch.float64)  # 0.9 * 0.75 >= 0.5: rejected
    >>> if kernels.supports(q):
    ...     masses = kernel_block_masses(q, p, ids, bonus, u)[:, :, 0]
    ... else:  # the rule's own masses of the same row
    ...     row = torch.tensor([0])
    ...     masses = block_masses(ProbRows(q[0]).select(row), 2, draft=ProbRows(p[0]).select(row))
    >>> masses
    tensor([[[1.0000]],
    <BLANKLINE>
            [[0.2500]]])
    """
    if method not in _RULE_IDS:
        raise ValueError(f"method must be 'chain' or 'block', got {method!r}")
    rule = _RULE_IDS[method]
    step = _padded_step(target_probs, draft_probs, draft_token_ids, bonus_token_ids, uniforms, rule)
    if step is None:
        batch, _, vocab = target_probs.shape
        shape = (2, batch, 1 - rule, -(-vocab // BLOCK))
        return torch.zeros(shape, dtype=torch.float32, device=target_probs.device)
    return _launch_masses(step).permute(2, 0, 1, 3)


RULES: dict[str, Callable[..., VerifyResult]] = {
    "chain": chain_kernel_verify,
    "block": block_kernel_verify,
}
"""The padded probability rules by name, as :class:`specsample.RejectionSampler` names them."""
