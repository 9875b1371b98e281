"""One verification pipeline: plan a step, then let a backend execute it.

Every entry point (:class:`specsample.RejectionSampler`, :func:`specsample.verify`,
:func:`specsample.verify_padded`, the generation loop) goes through here:

1. **plan** (:func:`plan_logits`): the batch layout and the sampling metadata (built by the
   caller), the statistics of every target row (:mod:`specsample.probs`), and the uniforms
   of the step (:mod:`specsample.random`), or those the caller gives;
2. **execute** (:func:`run_logits`, :func:`run_probs`): a backend
   (:mod:`specsample.backends`) accepts a prefix of the drafts and draws one more token;

Nothing here synchronises with the device.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specsample import backends
from specsample.checks import check_step_uniforms
from specsample.metadata import BatchLayout, SamplingMetadata
from specsample.probs import RowStats, sampling_stats
from specsample.random import Seeding, step_uniforms
from specsample.shared import VerifyResult


class Plan(NamedTuple):
    """A planned verification step on flattened target logits.

    Attributes
    ----------
    layout : BatchLayout
        The ragged layout.
    stats : RowStats
        ``[rows]`` statistics of the processed target rows.
    greedy : torch.Tensor
        ``[batch]`` bool greedy requests.
    uniforms : torch.Tensor or None
        ``[batch, max_drafts + 1]`` float64 uniforms; ``None`` when every request is greedy.
    """

    layout: BatchLayout
    stats: RowStats
    greedy: torch.Tensor
    uniforms: torch.Tensor | None


def plan_logits(
    target_logits: torch.Tensor,
    layout: BatchLayout,
    sampling: SamplingMetadata,
    seeding: Seeding,
    *,
    positions: torch.Tensor | None = None,
    uniforms: torch.Tensor | None = None,
    need_norm: bool = False,
) -> Plan:
    """Plan a step: per-row statistics with each request's parameters, and the uniforms.

    Parameters
    ----------
    target_logits : torch.Tensor
        ``[rows, vocab]`` flattened target logits.
    layout : BatchLayout
        The ragged layout of the rows.
    sampling : SamplingMetadata
        ``[batch]`` per-request parameters.
    seeding : Seeding
        Where each request's random numbers come from.
    positions : torch.Tensor, optional
        ``[batch]`` int64 absolute position of each request's first draft.
    uniforms : torch.Tensor, optional
        ``[batch, max_drafts + 1]`` float64 uniforms to use instead of drawing them.
    need_norm : bool
        Compute the normalisers even when every request is greedy (for log-probabilities).
    """
    per_row = sampling.rows(layout.target_request())
    stats = sampling_stats(target_logits, per_row, need_norm=need_norm or not sampling.all_greedy)
    device = target_logits.device
    if uniforms is not None:
        uniforms = check_step_uniforms(uniforms, layout.batch, layout.max_drafts + 1, device)
        if sampling.all_greedy:
            uniforms = None
    elif not sampling.all_greedy:
        uniforms = step_uniforms(seeding, layout.max_drafts, device, positions)
    return Plan(layout, stats, sampling.greedy, uniforms)


def run_logits(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    plan: Plan,
    *,
    backend: str,
    method: str,
    draft_probs: torch.Tensor | None = None,
    draft_logits: torch.Tensor | None = None,
    bonus_token_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Execute a planned step on a concrete backend: ``(token_ids, num_accepted)``.

    ``bonus_token_ids`` (``[batch]`` int64) is given when the target rows hold the draft
    positions only (no bonus rows).
    """
    layout = plan.layout
    if bonus_token_ids is not None and not layout.total_drafts:
        tokens = torch.full(
            (layout.batch, layout.max_drafts + 1),
            -1,
            dtype=torch.int64,
            device=bonus_token_ids.device,
        )
        tokens[:, 0] = bonus_token_ids.view(-1)
        return tokens, torch.zeros(layout.batch, dtype=torch.int64, device=tokens.device)
    step = backends.logits_step(backend)
    token_ids, num_accepted = step(
        target_logits,
        draft_token_ids,
        layout,
        plan.stats,
        plan.greedy,
        plan.uniforms,
        draft_probs=draft_probs,
        draft_logits=draft_logits,
        method=method,
        bonus_token_ids=bonus_token_ids,
    )
    return token_ids, num_accepted


def run_probs(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    seeding: Seeding,
    *,
    backend: str,
    method: str,
    positions: torch.Tensor | None = None,
    uniforms: torch.Tensor | None = None,
) -> VerifyResult:
    """Plan and execute a step on ``[batch, k, vocab]`` probabilities (already processed).

    The plan of a probability step is its uniforms alone (``[batch, k + 1]``, drawn from
    ``seeding`` at ``positions`` unless given).
    """
    batch, k, _ = target_probs.shape
    device = target_probs.device
    if uniforms is None:
        uniforms = step_uniforms(seeding, k, device, positions)
    else:
        uniforms = check_step_uniforms(uniforms, batch, k + 1, device)
    rule = backends.prob_rule(backend, method)
    return rule(target_probs, draft_probs, draft_token_ids, bonus_token_ids, uniforms)
