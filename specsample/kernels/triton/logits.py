"""The functional path by the Triton kernels: the step of :func:`specsample.verify` on logits.

:func:`verify_logits` takes the ragged target logits with their row statistics, the drafts
and, optionally, dense draft probabilities or logits, and runs both rules for greedy and
sampled requests in two kernel launches (see :mod:`specsample.kernels.triton.launch`).
"""

from __future__ import annotations

import torch

from specsample.kernels.triton.launch import KERNEL_METHODS, _check_device, _launch, _rule_id, _Step
from specsample.kernels.triton.norms import logit_norms
from specsample.methods import METHODS, check_method
from specsample.plan import LogitsStep
from specsample.probs import RowNorms
from specsample.rules.rows import unit_columns


def _dense_draft(
    draft_probs: torch.Tensor | None, draft_logits: torch.Tensor | None
) -> tuple[torch.Tensor | None, RowNorms | None]:
    """The dense draft rows and, for logits, their statistics (one pass of the row-statistics
    kernel); ``(None, None)``: one-hot."""
    draft = draft_probs if draft_probs is not None else draft_logits
    if draft is None or draft.shape[0] == 0:
        return None, None
    if draft_logits is None:
        return unit_columns(draft), None
    ones = torch.ones(draft.shape[0], dtype=torch.float32, device=draft.device)
    return unit_columns(draft), logit_norms(draft, ones)


def verify_logits(step: LogitsStep) -> tuple[torch.Tensor, torch.Tensor]:
    """The verification step of :func:`specsample.verify` after its plan, by the kernels.

    Greedy and sampled requests, ragged draft counts (zeros allowed), draft probabilities,
    draft logits or one-hot drafts, chain or block rule: everything
    :func:`specsample.verify` does between its row statistics and its output, in two kernel
    launches and with the same randomness (the same ``uniforms``).

    Parameters
    ----------
    step : LogitsStep
        The target rows (``[total_drafts + batch, vocab]``, or the draft rows only with
        bonus tokens, then no row past a request's drafts is read), the drafts, the plan
        (:class:`specsample.plan.Plan`: layout, row statistics, greedy requests, uniforms,
        the accept tests then the final draw), the rule and the
        bonus tokens.

    Returns
    -------
    tuple of torch.Tensor
        ``token_ids [batch, max_drafts + 1]`` int64 (accepted drafts, one more token, ``-1``)
        and ``num_accepted [batch]`` int64.

    Raises
    ------
    ValueError
        ``method="block"`` with sampled requests, drafts and no draft rows; an unknown method.

    Examples
    --------
    >>> import torch
    >>> from specsample.kernels import triton as kernels
    >>> from specsample.backends import eager
    >>> from specsample.params.layout import BatchLayout
    >>> from specsample.plan import Plan
    >>> from specsample.probs import row_norms
    >>> logits = torch.tensor([[0.0, 5.0], [5.0, 0.0]])  # a draft row, then the bonus row
    >>> plan = Plan(BatchLayout.build([1], logits.device), row_norms(logits, torch.ones(2)),
    ...             torch.tensor([True]), None)
    >>> verify = verify_logits if kernels.supports(logits) else eager.verify_logits
    >>> verify(LogitsStep(logits, torch.tensor([1]), plan))
    (tensor([[1, 0]]), tensor([1]))
    """
    target_logits, draft_token_ids, plan, method, draft_probs, draft_logits, bonus_token_ids = step
    layout, norms, greedy, uniforms = plan.layout, plan.norms, plan.greedy, plan.uniforms
    check_method(method, KERNEL_METHODS)
    if draft_probs is not None and draft_logits is not None:
        raise ValueError("pass draft_probs or draft_logits, not both")
    _check_device(target_logits, draft_token_ids, greedy, uniforms, draft_probs, draft_logits)
    k = layout.max_drafts
    if uniforms is not None and uniforms.shape != (layout.batch, k + 1):
        raise ValueError(f"uniforms must have shape {(layout.batch, k + 1)}")
    draft, draft_norms = _dense_draft(draft_probs, draft_logits)
    sampled = layout.total_drafts > 0 and uniforms is not None
    if sampled and METHODS[method].needs_draft_probs and draft is None:
        raise ValueError(
            f"method={method!r} needs draft_probs or draft_logits: with one-hot drafts it "
            "accepts exactly as many tokens in expectation as method='chain'"
        )
    launched = _Step(
        target=unit_columns(target_logits),
        target_norms=norms,
        draft=draft,
        draft_norms=draft_norms,
        ids=draft_token_ids,
        uniforms=uniforms.contiguous() if uniforms is not None else None,
        layout=layout,
        greedy=greedy,
        bonus=bonus_token_ids,
        batch=layout.batch,
        vocab=target_logits.shape[-1],
        k=k,
        steps=(0, 0),
        rule=_rule_id(method if sampled else "chain"),
    )
    return _launch(launched)
