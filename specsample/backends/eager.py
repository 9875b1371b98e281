"""The PyTorch backend: the reference execution of a verification step, on any device.

:func:`verify_logits` runs the step of :func:`specsample.verify` after its plan (row
statistics and uniforms) with plain tensor operations; :func:`prob_rule` gives the rules on
``[batch, k, vocab]`` probabilities. The Triton backend (:mod:`specsample.backends.triton`)
computes the same thing with fused kernels, on the same uniforms.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from specsample.params.layout import BatchLayout
from specsample.params.metadata import SamplingMetadata
from specsample.plan import LogitsStep
from specsample.probs import RowNorms, sampling_norms, scaled_logits
from specsample.probs import row_norms as processed_norms
from specsample.rules.block import (
    block_length,
    block_verify,
    block_weights,
    residual_mass_per_position,
)
from specsample.rules.chain import PaddedRule, chain_verify, count_accepted
from specsample.rules.gumbel import gumbel_argmax
from specsample.rules.residual import sample_residual, sample_rows
from specsample.rules.rows import LogitRows, ProbRows

_PROB_RULES: dict[str, PaddedRule] = {"chain": chain_verify, "block": block_verify}


def prob_rule(method: str) -> PaddedRule:
    """The rule on probabilities of an exact chain method:
    ``rule(target, draft, ids, bonus, uniforms)``."""
    return _PROB_RULES[method]


class Drafts(NamedTuple):
    """The drafts of a step, padded to ``[batch, max_drafts + 1]``.

    The last column is never a draft: it is where a request that accepts every draft of
    the widest count writes its last token. No tensor of the step is then ``max_drafts``
    wide, a width that :func:`torch.compile` would have to tell apart from 1 (a size it
    specialises), so one graph verifies every draft count from 1 up.

    Attributes
    ----------
    ids : torch.Tensor
        int64 drafts, ``-1`` past each request's count.
    safe_ids : torch.Tensor
        ``ids`` clamped into ``[0, vocab)`` (for gathers).
    valid : torch.Tensor
        bool: a real draft whose id lies in the vocabulary.
    draft_rows, target_rows : torch.Tensor
        int64 flattened row of each draft position, clamped to the last row.
    """

    ids: torch.Tensor
    safe_ids: torch.Tensor
    valid: torch.Tensor
    draft_rows: torch.Tensor
    target_rows: torch.Tensor


class Step(NamedTuple):
    """What the sampled rules read: the rows, the probabilities at the drafts, the uniforms.

    Attributes
    ----------
    target : LogitRows
        The processed target rows.
    source : ProbRows or LogitRows or None
        The draft rows (``None``: one-hot drafts).
    q_at, p_at : torch.Tensor
        ``[batch, max_drafts + 1]`` float64 target and draft probabilities of the padded
        drafts (the last column is never a draft).
    uniforms : torch.Tensor
        ``[batch, max_drafts + 1]`` float64: the accept tests, then the final draw.
    layout : BatchLayout
        The ragged layout.
    drafts : Drafts
        The padded drafts.
    """

    target: LogitRows
    source: ProbRows | LogitRows | None
    q_at: torch.Tensor
    p_at: torch.Tensor
    uniforms: torch.Tensor
    layout: BatchLayout
    drafts: Drafts


def row_norms(
    logits: torch.Tensor, sampling: SamplingMetadata, *, need_norm: bool = False
) -> RowNorms:
    """The statistics of ``[rows, vocab]`` logits, each row processed with its parameters in
    ``sampling`` (:func:`specsample.probs.sampling_norms`): the normalisers of every row when
    a request samples or with ``need_norm``, else the argmaxes alone.

    Examples
    --------
    >>> meta = SamplingMetadata.build(1, torch.device("cpu"), temperature=0.0)
    >>> row_norms(torch.tensor([[1.0, 3.0]]), meta).log_norm.isnan().tolist()
    [True]
    """
    return sampling_norms(logits, sampling, need_norm=need_norm or not sampling.all_greedy)


def log_q(
    logits: torch.Tensor, norms: RowNorms, rows: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """``log q(ids)`` at target ``rows`` (same shape), ``-inf`` where the token is filtered.

    Examples
    --------
    >>> import torch
    >>> logits = torch.tensor([[0.0, 0.0]])
    >>> s = processed_norms(logits, torch.ones(1))
    >>> log_q(logits, s, torch.tensor([0]), torch.tensor([1])).exp().tolist()
    [0.5]
    """
    z = scaled_logits(logits[rows, ids], norms.shift[rows], norms.inv_temperature[rows])
    return torch.where(z >= norms.cutoff[rows], z - norms.log_norm[rows], -torch.inf)


def pad_drafts(
    draft_token_ids: torch.Tensor, layout: BatchLayout, vocab: int, target_rows: int
) -> Drafts:
    """Pad the flat ``[total_drafts]`` drafts to ``[batch, max_drafts + 1]`` (see
    :class:`Drafts`).

    Examples
    --------
    >>> layout = BatchLayout.build([2, 0], torch.device("cpu"))
    >>> pad_drafts(torch.tensor([3, 1]), layout, 4, 4).ids.tolist()
    [[3, 1, -1], [-1, -1, -1]]
    """
    device = draft_token_ids.device
    cols = torch.arange(layout.max_drafts + 1, device=device)
    in_request = cols < layout.num_drafts.unsqueeze(-1)
    draft_rows = (layout.draft_start.unsqueeze(-1) + cols).clamp_(
        max=max(layout.total_drafts - 1, 0)
    )
    rows = (layout.target_start.unsqueeze(-1) + cols).clamp_(max=max(target_rows - 1, 0))
    if layout.total_drafts:
        ids = torch.where(in_request, draft_token_ids.to(torch.int64)[draft_rows], -1)
    else:
        ids = torch.full(in_request.shape, -1, dtype=torch.int64, device=device)
    valid = in_request & (ids >= 0) & (ids < vocab)
    return Drafts(ids, ids.clamp(0, vocab - 1), valid, draft_rows, rows)


def _draft_side(
    draft_probs: torch.Tensor | None,
    draft_logits: torch.Tensor | None,
    drafts: Drafts,
) -> tuple[ProbRows | LogitRows | None, torch.Tensor]:
    """The draft rows as a source for the residual, and ``p(ids)`` (float64) at the drafts.

    Without draft rows (or without any draft in the batch) the drafts are one-hot: no
    source, and ``p = 1`` at every draft.
    """
    index, ids = drafts.draft_rows, drafts.safe_ids
    if draft_probs is not None and draft_probs.shape[0]:
        return ProbRows(draft_probs), draft_probs[index, ids].to(torch.float64)
    if draft_logits is not None and draft_logits.shape[0]:
        ones = torch.ones(draft_logits.shape[0], device=draft_logits.device)
        norms = processed_norms(draft_logits, ones)
        return LogitRows(draft_logits, norms), log_q(draft_logits, norms, index, ids).exp().double()
    return None, torch.ones(ids.shape, dtype=torch.float64, device=ids.device)


def verify_logits(step: LogitsStep) -> tuple[torch.Tensor, torch.Tensor]:
    """A planned chain or block step, in PyTorch: ``(token_ids, num_accepted)``.

    Parameters
    ----------
    step : LogitsStep
        The target rows, the drafts (ids, and their rows or none: one-hot), the plan (layout,
        row statistics, greedy requests, uniforms), the rule and the given bonus tokens.

    Returns
    -------
    tuple of torch.Tensor
        ``[batch, max_drafts + 1]`` int64 tokens and ``[batch]`` int64 accepted counts.

    Examples
    --------
    >>> from specsample.plan import Plan
    >>> logits = torch.tensor([[0.0, 5.0], [5.0, 0.0]])  # a draft row, then the bonus row
    >>> plan = Plan(BatchLayout.build([1], logits.device), processed_norms(logits, torch.ones(2)),
    ...             torch.tensor([True]), None)
    >>> verify_logits(LogitsStep(logits, torch.tensor([1]), plan))
    (tensor([[1, 0]]), tensor([1]))
    """
    target_logits, draft_token_ids, plan, method, draft_probs, draft_logits, bonus_token_ids = step
    layout, norms, greedy, uniforms = plan.layout, plan.norms, plan.greedy, plan.uniforms
    if not layout.max_drafts:
        return _plain_step(target_logits, layout, norms, greedy, uniforms, bonus_token_ids)
    rows = target_logits.shape[0]
    drafts = pad_drafts(draft_token_ids, layout, target_logits.shape[-1], rows)
    usable = ~torch.isnan(norms.cutoff[drafts.target_rows])
    greedy_ok = (drafts.ids == norms.argmax[drafts.target_rows]) & usable
    num_accepted = count_accepted(greedy_ok & drafts.valid)
    final = norms.argmax[(layout.target_start + num_accepted).clamp_(max=max(rows - 1, 0))]
    if uniforms is not None:
        source, p_at = _draft_side(draft_probs, draft_logits, drafts)
        q_at = log_q(target_logits, norms, drafts.target_rows, drafts.safe_ids).exp().double()
        target = LogitRows(target_logits, norms)
        rule = _block_step if method == "block" and layout.total_drafts else _chain_step
        sampled, drawn = rule(Step(target, source, q_at, p_at, uniforms, layout, drafts))
        num_accepted = torch.where(greedy, num_accepted, sampled)
        final = torch.where(greedy, final, drawn)
    if bonus_token_ids is not None:
        final = torch.where(num_accepted == layout.num_drafts, bonus_token_ids, final)
    return _emit(drafts.ids, num_accepted, final), num_accepted


def verify_gumbel(step: LogitsStep) -> tuple[torch.Tensor, torch.Tensor]:
    """A planned ``method="gumbel"`` step, in PyTorch: ``(token_ids, num_accepted)``.

    Every target row's token is its keyed Gumbel-max token
    (:func:`specsample.rules.gumbel.gumbel_argmax`; greedy requests: the argmax); drafts
    are accepted while they equal those tokens, and the first mismatch, or the bonus row,
    emits the target's token. The drafts' own rows are not read.

    Examples
    --------
    >>> from specsample.plan import Plan
    >>> logits = torch.tensor([[0.0, 50.0], [50.0, 0.0]])  # a draft row, then the bonus row
    >>> norms = processed_norms(logits, torch.ones(2))
    >>> plan = Plan(BatchLayout.build([1], logits.device), norms, torch.tensor([False]), None,
    ...             keys=torch.tensor([3, 4]))
    >>> verify_gumbel(LogitsStep(logits, torch.tensor([1]), plan, "gumbel"))
    (tensor([[1, 0]]), tensor([1]))
    """
    target_logits, plan, bonus_token_ids = step.target_logits, step.plan, step.bonus_token_ids
    layout, norms = plan.layout, plan.norms
    tokens = norms.argmax
    if plan.keys is not None:
        drawn = gumbel_argmax(target_logits, norms, plan.keys)
        tokens = torch.where(plan.greedy[layout.target_request], tokens, drawn)
    rows = target_logits.shape[0]
    drafts = pad_drafts(step.draft_token_ids, layout, target_logits.shape[-1], rows)
    usable = ~torch.isnan(norms.cutoff[drafts.target_rows])
    matched = (drafts.ids == tokens[drafts.target_rows]) & usable & drafts.valid
    num_accepted = count_accepted(matched[:, : layout.max_drafts])
    final = tokens[(layout.target_start + num_accepted).clamp_(max=max(rows - 1, 0))]
    if bonus_token_ids is not None:
        final = torch.where(num_accepted == layout.num_drafts, bonus_token_ids, final)
    return _emit(drafts.ids, num_accepted, final), num_accepted


def _emit(ids: torch.Tensor, num_accepted: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """``[batch, max_drafts + 1]`` output from the padded drafts ``ids`` (see :class:`Drafts`):
    the accepted drafts, ``last``, then ``-1`` (:func:`~specsample.rules.chain.emit`)."""
    cols = torch.arange(ids.shape[1], device=ids.device)
    kept = torch.where(cols < num_accepted.unsqueeze(-1), ids, -1)
    return kept.scatter_(1, num_accepted.unsqueeze(-1), last.unsqueeze(-1))


def _plain_step(
    target_logits: torch.Tensor,
    layout: BatchLayout,
    norms: RowNorms,
    greedy: torch.Tensor,
    uniforms: torch.Tensor | None,
    bonus_token_ids: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """A step without any draft: each request emits one token from its processed row.

    The chain rule's draw at zero drafts (greedy rows: the argmax; sampled rows: the target
    row itself by :func:`~specsample.rules.residual.sample_rows`, with the step's final
    uniform), in far fewer operations: a plain decoding step's cost matters as much as a
    speculative one's.
    """
    if bonus_token_ids is not None:
        final = bonus_token_ids.to(torch.int64).view(-1)
    else:
        rows = layout.target_start.clamp(max=max(target_logits.shape[0] - 1, 0))
        final = norms.argmax[rows]
        if uniforms is not None:
            drawn = sample_rows(LogitRows(target_logits, norms), rows, uniforms[:, -1])
            final = torch.where(greedy, final, drawn)
    zeros = torch.zeros(layout.batch, dtype=torch.int64, device=final.device)
    return final.unsqueeze(-1), zeros


def _chain_step(step: Step) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token rule: accepted counts, and the residual or bonus draw after them."""
    target, source, q_at, p_at, uniforms, layout, drafts = step
    num_accepted = count_accepted((uniforms * p_at < q_at) & drafts.valid)
    last_row = max(target.logits.shape[0] - 1, 0)
    selected = target.select((layout.target_start + num_accepted).clamp_(max=last_row))
    vocab = target.logits.shape[-1]
    if source is None:  # the draft at the first rejection; -1 (none) when all were accepted
        token = drafts.ids.gather(1, num_accepted.unsqueeze(-1)).squeeze(-1)
        return num_accepted, sample_residual(selected, uniforms[:, -1], vocab, draft_token=token)
    row = (layout.draft_start + num_accepted).clamp_(max=max(layout.total_drafts - 1, 0))
    drawn = sample_residual(
        selected,
        uniforms[:, -1],
        vocab,
        draft=source.select(row),
        draft_weight=(num_accepted < layout.num_drafts).to(torch.float32),
    )
    return num_accepted, drawn


def _block_step(step: Step) -> tuple[torch.Tensor, torch.Tensor]:
    """Block rule: accepted lengths, and the draw at row ``tau`` (the bonus row if all pass).

    The block masses of every target row of the batch, bonus rows included, are computed
    once: the ``Z_i`` read the draft rows, and the final draw reuses the masses of row ``tau``.
    """
    target, source, q_at, p_at, uniforms, layout, drafts = step
    if source is None:
        raise ValueError(
            "method='block' needs draft_probs or draft_logits: with one-hot drafts it accepts "
            "exactly as many tokens in expectation as method='chain'"
        )
    vocab = target.logits.shape[-1]
    width = layout.max_drafts
    weights = block_weights(q_at[:, :width], p_at[:, :width], drafts.valid[:, :width])
    cols = torch.arange(width + 1, device=q_at.device)
    last_target = max(target.logits.shape[0] - 1, 0)
    target_rows = (layout.target_start.unsqueeze(-1) + cols).clamp_(max=last_target)
    draft_rows = (layout.draft_start.unsqueeze(-1) + cols).clamp_(
        max=max(layout.total_drafts - 1, 0)
    )
    masses, residual = residual_mass_per_position(
        target.select(target_rows.view(-1)),
        source.select(draft_rows.view(-1)),
        torch.cat([weights, weights[:, -1:]], dim=1),
        vocab,
    )
    tau = block_length(weights, residual[:, :width], layout.num_drafts, uniforms[:, :-1])
    index = tau.view(1, -1, 1, 1).expand(2, -1, 1, masses.shape[-1])
    drawn = sample_residual(
        target.select(target_rows.gather(1, tau.unsqueeze(-1)).squeeze(-1)),
        uniforms[:, -1],
        vocab,
        draft=source.select(draft_rows.gather(1, tau.unsqueeze(-1)).squeeze(-1)),
        draft_weight=(tau < layout.num_drafts).to(torch.float32),
        target_scale=weights.gather(1, tau.unsqueeze(-1)).squeeze(-1).to(torch.float32),
        masses=masses.gather(2, index).squeeze(2),
    )
    return tau, drawn
