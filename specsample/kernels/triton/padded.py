"""The padded probability rules by the Triton kernels: ``[batch, k, vocab]`` rows, as in
:mod:`specsample.rules`.

:class:`KernelRule` takes the arguments and gives the result of
:func:`specsample.rules.chain.chain_verify` or :func:`specsample.rules.block.block_verify`;
:data:`RULES` holds one per exact chain method of :mod:`specsample.methods`.
:func:`kernel_block_masses` runs the masses phase of the kernel alone and returns the block
masses the draw reads, to be compared with the rules' own
(:func:`specsample.rules.residual.block_masses`).
"""

from __future__ import annotations

import torch

from specsample.kernels.triton.launch import (
    KERNEL_METHODS,
    _check_device,
    _launch,
    _launch_masses,
    _rule_id,
    _Step,
)
from specsample.methods import check_method
from specsample.rules.chain import ChainStep, PaddedRule, VerifyResult
from specsample.rules.residual import BLOCK
from specsample.rules.rows import flat_rows, unit_columns


def _padded_step(step: ChainStep, rule: int) -> _Step | None:
    """Check the arguments of the padded probability rules and lay them out as a step.

    ``rule`` is the kernel's (:func:`specsample.kernels.triton.launch._rule_id`); None when ``k =
    0``
    (no draft to verify).
    """
    target_probs, draft_probs, draft_token_ids, bonus_token_ids, uniforms = step
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
        target=unit_columns(target_rows),
        target_norms=None,
        draft=unit_columns(draft_rows),
        draft_norms=None,
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


class KernelRule(PaddedRule):
    """A padded probability rule run by the Triton kernel; same contract as the rule it names.

    Called with the arguments of :func:`specsample.rules.chain.chain_verify` (``"chain"``:
    token-by-token verification) or :func:`specsample.rules.block.block_verify`
    (``"block"``: block verification, the first ``k`` uniforms being the ``eta_i``), it
    returns the same result with the same randomness: given the same uniforms it emits the
    same tokens, up to floating-point ties (a uniform within rounding of a boundary of the
    inverse CDF). The residual is computed only at the row the draw reads (chain; not at all
    when every draft is accepted) or, for the block rule, at every position, in a first
    launch; a second one verifies and draws.

    The rule is called as :meth:`PaddedRule.__call__ <specsample.rules.chain.PaddedRule.__call__>`
    documents, with ``target_probs`` and ``draft_probs`` in float32, float16, bfloat16 or
    float64 (unit column stride preferred; other layouts are copied) and
    ``draft_token_ids`` int64 or int32.

    Parameters
    ----------
    method : str
        An exact chain method of :func:`specsample.methods.chain_methods`.

    Raises
    ------
    ValueError
        An unknown ``method``; when called, arguments of the wrong shape or dtype, or on
        different devices.
    RuntimeError
        When called: Triton is missing, or the tensors are on the CPU without
        ``TRITON_INTERPRET=1``.

    Examples
    --------
    >>> import torch
    >>> from specsample.kernels import triton as kernels
    >>> from specsample.rules import block, chain
    >>> q = torch.tensor([[[1 / 3, 2 / 3], [1 / 3, 2 / 3]]])
    >>> p = torch.tensor([[[2 / 3, 1 / 3], [2 / 3, 1 / 3]]])
    >>> u = torch.tensor([[0.9, 0.1, 0.5]], dtype=torch.float64)
    >>> ids, bonus = torch.tensor([[0, 0]]), torch.tensor([1])
    >>> for method, reference in (("chain", chain.chain_verify), ("block", block.block_verify)):
    ...     verify = KernelRule(method) if kernels.supports(q) else reference
    ...     print(method, verify(q, p, ids, bonus, u).token_ids.tolist())
    chain [[1, -1, -1]]
    block [[0, 0, 1]]
    """

    def __init__(self, method: str) -> None:
        self.method = check_method(method, KERNEL_METHODS)
        self.rule = _rule_id(self.method)

    def __repr__(self) -> str:
        return f"KernelRule({self.method!r})"

    def verify(self, step: ChainStep) -> VerifyResult:
        """The rule's result on ``step``, by the kernel."""
        launch = _padded_step(step, self.rule)
        if launch is None:
            return step.bonus_only()
        return VerifyResult(*_launch(launch))


RULES: dict[str, KernelRule] = {method: KernelRule(method) for method in KERNEL_METHODS}
"""The padded probability rules by name, as :class:`specsample.RejectionSampler` names them."""

chain_kernel_verify = RULES["chain"]
"""Token-by-token verification by the kernel: :func:`specsample.rules.chain.chain_verify`."""

block_kernel_verify = RULES["block"]
"""Block verification by the kernel: :func:`specsample.rules.block.block_verify`."""


def kernel_block_masses(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    uniforms: torch.Tensor,
    method: str = "chain",
) -> torch.Tensor:
    """The block masses the kernel draws the residual from, by its masses phase alone.

    The kernel computes them as :mod:`specsample.rules.residual` does, operation by
    operation, so that they equal the rule's float64 values (exactly wherever each block's
    float64 sum is exact, as its order of summation may differ). The rows are those the rule
    reads: for ``method="chain"`` the row at each sequence's first rejected position, as
    :func:`specsample.rules.residual.block_masses` of the rows
    :func:`specsample.rules.chain.chain_verify` selects; for ``"block"`` every draft row
    ``i`` with block verification's weight ``w_i``, as the masses of
    :func:`specsample.rules.block.residual_mass_per_position`.

    Parameters
    ----------
    target_probs, draft_probs, draft_token_ids, bonus_token_ids, uniforms : torch.Tensor
        As for :class:`KernelRule` (the uniforms decide the chain's rejected row).
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
        An unknown ``method``, or arguments that :class:`KernelRule` refuses.

    Examples
    --------
    >>> import torch
    >>> from specsample.kernels import triton as kernels
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
            [[0.2500]]], dtype=torch.float64)
    """
    rule = _rule_id(check_method(method, KERNEL_METHODS))
    step = _padded_step(
        ChainStep(target_probs, draft_probs, draft_token_ids, bonus_token_ids, uniforms), rule
    )
    if step is None:
        batch, _, vocab = target_probs.shape
        shape = (2, batch, 1 - rule, -(-vocab // BLOCK))
        return torch.zeros(shape, dtype=torch.float64, device=target_probs.device)
    return _launch_masses(step).permute(2, 0, 1, 3)
