"""The functional path by the Triton kernels: the step of :func:`specsample.verify` on logits.

:func:`verify_logits` takes the ragged target logits with their row statistics, the drafts
and, optionally, dense draft probabilities or logits, and runs both rules for greedy and
sampled requests in two kernel launches (see :mod:`specsample.kernels.launch`).
"""

from __future__ import annotations

import torch

from specsample.kernels.launch import _check_device, _launch, _Step, _unit_columns
from specsample.metadata import BatchLayout
from specsample.probs import RowStats, row_stats


def _logits_step(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    layout: BatchLayout,
    stats: RowStats,
    greedy: torch.Tensor,
    uniforms: torch.Tensor | None,
    draft: torch.Tensor | None,
    draft_is_logits: bool,
    method: str,
    bonus_token_ids: torch.Tensor | None,
) -> _Step:
    """Check the arguments of :func:`verify_logits` and lay them out as a step."""
    k = layout.max_drafts
    if uniforms is not None and uniforms.shape != (layout.batch, k + 1):
        raise ValueError(f"uniforms must have shape {(layout.batch, k + 1)}")
    if draft is not None and draft.shape[0] == 0:
        draft = None
    draft_stats = None
    if draft is not None and draft_is_logits:
        draft_stats = row_stats(draft, torch.ones(draft.shape[0], device=draft.device))
    rule = 1 if method == "block" and layout.total_drafts and uniforms is not None else 0
    if rule == 1 and draft is None:
        raise ValueError(
            "method='block' needs draft_probs or draft_logits: with one-hot drafts it accepts "
            "exactly as many tokens in expectation as method='chain'"
        )
    return _Step(
        target=_unit_columns(target_logits),
        target_stats=stats,
        draft=_unit_columns(draft) if draft is not None else None,
        draft_stats=draft_stats,
        ids=draft_token_ids,
        uniforms=uniforms.contiguous() if uniforms is not None else None,
        layout=layout,
        greedy=greedy,
        bonus=bonus_token_ids,
        batch=layout.batch,
        vocab=target_logits.shape[-1],
        k=k,
        steps=(0, 0),
        rule=rule,
    )


def verify_logits(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    layout: BatchLayout,
    stats: RowStats,
    greedy: torch.Tensor,
    uniforms: torch.Tensor | None,
    *,
    draft_probs: torch.Tensor | None = None,
    draft_logits: torch.Tensor | None = None,
    method: str = "chain",
    bonus_token_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The verification step of :func:`specsample.verify` after the row statistics.

    Greedy and sampled requests, ragged draft counts (zeros allowed), draft probabilities,
    draft logits or one-hot drafts, chain or block rule: everything
    :func:`specsample.verify` does between its row statistics and its output, in two kernel
    launches and with the same randomness (the same ``uniforms``).

    Parameters
    ----------
    target_logits : torch.Tensor
        ``[total_drafts + batch, vocab]`` target logits, request after request (its draft
        rows, then its bonus row).
    draft_token_ids : torch.Tensor
        ``[total_drafts]`` int64 or int32 drafts.
    layout : BatchLayout
        The ragged layout (:meth:`specsample.metadata.BatchLayout.build`).
    stats : RowStats
        :func:`specsample.probs.row_stats` of every target row, each ``[total_drafts + batch]``
        (``log_norm`` may be NaN where only greedy requests read the row).
    greedy : torch.Tensor
        ``[batch]`` bool: requests verified by argmax matching.
    uniforms : torch.Tensor or None
        ``[batch, max_drafts + 1]`` float64 (:func:`specsample.random.step_uniforms`); ``None``
        when every request is greedy.
    draft_probs, draft_logits : torch.Tensor, optional
        ``[total_drafts, vocab]``; neither means one-hot drafts.
    method : str
        ``"chain"`` or ``"block"`` (which needs draft rows when a request samples).
    bonus_token_ids : torch.Tensor, optional
        ``[batch]`` int64 tokens a request emits when all its drafts are accepted; then
        ``target_logits`` holds the draft rows only (``layout.bonus_rows`` is false) and no
        row past a request's drafts is read.

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
    >>> from specsample import kernels
    >>> from specsample.backends import eager
    >>> from specsample.metadata import BatchLayout
    >>> from specsample.probs import row_stats
    >>> logits = torch.tensor([[0.0, 5.0], [5.0, 0.0]])  # a draft row, then the bonus row
    >>> layout = BatchLayout.build([1], logits.device)
    >>> stats = row_stats(logits, torch.ones(2))
    >>> greedy = torch.tensor([True])
    >>> verify = verify_logits if kernels.supports(logits) else eager.verify_logits
    >>> verify(logits, torch.tensor([1]), layout, stats, greedy, None)
    (tensor([[1, 0]]), tensor([1]))
    """
    if method not in ("chain", "block"):
        raise ValueError(f"method must be 'chain' or 'block', got {method!r}")
    if draft_probs is not None and draft_logits is not None:
        raise ValueError("pass draft_probs or draft_logits, not both")
    _check_device(target_logits, draft_token_ids, greedy, uniforms, draft_probs, draft_logits)
    draft = draft_probs if draft_probs is not None else draft_logits
    step = _logits_step(
        target_logits,
        draft_token_ids,
        layout,
        stats,
        greedy,
        uniforms,
        draft,
        draft_logits is not None,
        method,
        bonus_token_ids,
    )
    return _launch(step)
