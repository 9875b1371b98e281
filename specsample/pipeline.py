"""One verification pipeline: plan a step, then let a backend execute it.

Every entry point (:class:`specsample.RejectionSampler`, :func:`specsample.verify`,
:func:`specsample.verify_padded`, :func:`specsample.verify_tree`, and through them the
generation loop) goes through here:

1. **plan** (:func:`plan_logits`): the batch layout and the requests (built and validated by
   the caller, :class:`specsample.params.Requests`), the statistics of every target row
   (:mod:`specsample.probs`), and the uniforms of the step (:mod:`specsample.random`), or
   those the caller gives;
2. **execute** (:func:`run_logits`, :func:`run_typical`, :func:`run_tree`, :func:`run_probs`):
   a backend (:func:`specsample.backends.get`) accepts a prefix of the drafts, or a path of
   a tree, and draws one more token; :func:`emitted_logprobs` reads log-probabilities
   through the same backend.

Nothing here synchronises with the device.
"""

from __future__ import annotations

import torch

from specsample import backends
from specsample.methods import METHODS
from specsample.noise import request_keys, row_keys
from specsample.params import Requests
from specsample.params.checks import check_step_uniforms
from specsample.params.layout import BatchLayout
from specsample.params.seeding import Seeding
from specsample.plan import LogitsStep, Plan, TreeStep
from specsample.probs import RowNorms
from specsample.rules.chain import ChainStep, VerifyResult
from specsample.rules.gumbel import gumbel_probs
from specsample.rules.tree.structure import TreeVerifyResult
from specsample.uniforms import step_uniforms


def target_norms(
    target_logits: torch.Tensor,
    layout: BatchLayout,
    requests: Requests,
    *,
    need_norm: bool,
    backend: str = "torch",
) -> RowNorms:
    """``[rows]`` statistics of the target rows, each processed with its request's parameters
    (the normalisers of greedy-only batches only with ``need_norm``), by ``backend``."""
    per_row = requests.sampling.rows(layout.target_request)
    return backends.get(backend).row_norms(target_logits, per_row, need_norm=need_norm)


def step_keys(layout: BatchLayout, requests: Requests, device: torch.device) -> torch.Tensor:
    """``[target_rows]`` int64 row keys of the keyed Gumbel noise (:mod:`specsample.noise`):
    a request's ``j``-th target row reads its key at its counter plus ``j``."""
    keys, counters = request_keys(requests.seeding, requests.positions, device)
    request = layout.target_request
    offset = torch.arange(layout.target_rows, device=device) - layout.target_start[request]
    return row_keys(keys[request], counters[request] + offset)


def plan_logits(
    target_logits: torch.Tensor,
    layout: BatchLayout,
    requests: Requests,
    *,
    uniforms: torch.Tensor | None = None,
    need_norm: bool = False,
    backend: str = "torch",
    keyed: bool = False,
) -> Plan:
    """Plan a step: per-row statistics with each request's parameters, and the uniforms
    (with ``keyed``, the row keys of ``method="gumbel"`` instead).

    Parameters
    ----------
    target_logits : torch.Tensor
        ``[rows, vocab]`` flattened target logits.
    layout : BatchLayout
        The ragged layout of the rows.
    requests : Requests
        ``[batch]`` per-request parameters, random sources and positions.
    uniforms : torch.Tensor, optional
        ``[batch, max_drafts + 1]`` float64 uniforms to use instead of drawing them.
    need_norm : bool
        Compute the normalisers even when every request is greedy (for log-probabilities).
    backend : str
        The concrete backend that computes the statistics.
    keyed : bool
        Plan a ``method="gumbel"`` step: row keys, no uniforms (``uniforms`` is refused).
    """
    sampling = requests.sampling
    norms = target_norms(target_logits, layout, requests, need_norm=need_norm, backend=backend)
    device = target_logits.device
    if keyed:
        if uniforms is not None:
            raise ValueError("uniforms: method='gumbel' reads keyed Gumbel noise, not uniforms")
        keys = None if sampling.all_greedy else step_keys(layout, requests, device)
        return Plan(layout, norms, sampling.greedy, None, keys=keys)
    if uniforms is not None:
        uniforms = check_step_uniforms(uniforms, layout.batch, layout.max_drafts + 1, device)
        return Plan(layout, norms, sampling.greedy, None if sampling.all_greedy else uniforms)
    if sampling.all_greedy:
        return Plan(layout, norms, sampling.greedy, None)
    uniforms = step_uniforms(requests.seeding, layout.max_drafts, device, requests.positions)
    return Plan(layout, norms, sampling.greedy, uniforms)


def run_logits(step: LogitsStep, *, backend: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Execute a planned chain or block step on a concrete backend:
    ``(token_ids, num_accepted)``.

    A step whose bonus tokens are given and that has no draft at all emits them directly;
    a ``method="gumbel"`` step goes to the backend's Gumbel slot.
    """
    layout, bonus_token_ids = step.plan.layout, step.bonus_token_ids
    if bonus_token_ids is not None and not layout.total_drafts:
        tokens = torch.full(
            (layout.batch, layout.max_drafts + 1),
            -1,
            dtype=torch.int64,
            device=bonus_token_ids.device,
        )
        tokens[:, 0] = bonus_token_ids.view(-1)
        return tokens, torch.zeros(layout.batch, dtype=torch.int64, device=tokens.device)
    if METHODS[step.method].keyed:
        return backends.get(backend).gumbel(step)
    return backends.get(backend).verify_logits(step)


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
    ``seeding`` at ``positions`` unless given). The caller has checked the tensors (as
    :func:`specsample.rules.chain.check_rule_inputs` does), so the rule does not again.
    A ``method="gumbel"`` step's plan is its row keys instead
    (:func:`specsample.rules.gumbel.gumbel_probs`, in PyTorch on every backend).
    """
    batch, k, _ = target_probs.shape
    device = target_probs.device
    if METHODS[method].keyed:
        if uniforms is not None:
            raise ValueError("uniforms: method='gumbel' reads keyed Gumbel noise, not uniforms")
        keys, counters = request_keys(seeding, positions, device)
        cols = torch.arange(k, device=device)
        rows = row_keys(keys.repeat_interleave(k), (counters.unsqueeze(-1) + cols).view(-1))
        return gumbel_probs(target_probs, draft_token_ids, bonus_token_ids, rows.view(batch, k))
    rule = backends.get(backend).prob_rule(method)
    if uniforms is None:
        uniforms = step_uniforms(seeding, k, device, positions)
    else:
        uniforms = check_step_uniforms(uniforms, batch, k + 1, device)
    return rule.run(
        ChainStep(target_probs, draft_probs, draft_token_ids, bonus_token_ids, uniforms)
    )


def run_typical(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    layout: BatchLayout,
    requests: Requests,
    *,
    backend: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Execute a typical-acceptance step (LOSSY): ``(token_ids, num_accepted)``.

    The rule needs no uniforms and reads whole processed rows, so its plan is the
    requests' parameters alone.
    """
    return backends.get(backend).typical(target_logits, draft_token_ids, layout, requests.sampling)


def run_tree(step: TreeStep, *, backend: str) -> TreeVerifyResult:
    """Execute a tree step on a concrete backend. Its plan is the requests' processing,
    which the backend applies to the rows it reads, and the uniforms the rule draws."""
    return backends.get(backend).tree(step)


def emitted_logprobs(
    target_logits: torch.Tensor,
    layout: BatchLayout,
    norms: RowNorms,
    token_ids: torch.Tensor,
    *,
    backend: str,
) -> torch.Tensor:
    """``[batch, max_drafts + 1]`` float32 ``log q`` of each emitted token at its own target
    row (``norms``, with normalisers); NaN at padding."""
    cols = torch.arange(token_ids.shape[-1], device=token_ids.device)
    rows = (layout.target_start.unsqueeze(-1) + cols).clamp_(max=target_logits.shape[0] - 1)
    log_q = backends.get(backend).log_q
    logprobs = log_q(target_logits, norms, rows, token_ids.clamp(min=0))
    return logprobs.masked_fill_(token_ids < 0, torch.nan)
