"""The functional API engines call: :func:`verify` on flattened, ragged logits.

The batch is flattened the way serving engines hold it: request ``i`` contributes
``num_draft_tokens[i]`` draft positions (zero allowed) and one bonus position. Target logits
hold, request after request, the rows of its draft positions then of its bonus position
(``[total_drafts + batch, vocab]``); draft ids (and draft probabilities or logits, when the
drafter has them) hold the draft positions only (``[total_drafts]``, ``[total_drafts, vocab]``).

The contract. The distribution preserved is the target's *processed* distribution: its
logits after the request's temperature, top-k, top-p and min-p, in that order (see
:mod:`specsample.probs`). The draft distribution must be exactly the one each draft was
sampled from: ``draft_probs`` as given, or ``softmax(draft_logits)`` (apply the drafter's
own temperature and filters before passing logits). Without either, the draft is treated as
one-hot: draft ``x`` is accepted with probability ``q(x)``, and on rejection the token is
drawn from ``q`` with ``x`` removed, renormalised; this is exact for any drafter, n-gram and
greedy heads included, as long as the draft does not depend on the verifier's randomness.
Requests with temperature 0 are greedy: drafts are accepted while they equal the target
argmax, the first mismatch emits the argmax, and the bonus is the argmax of the bonus row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from specsample import kernels
from specsample.metadata import BatchLayout, SamplingMetadata, Scalars
from specsample.probs import RowStats, row_stats
from specsample.random import step_uniforms
from specsample.rules.block import block_length, block_weights, residual_mass_per_position
from specsample.rules.chain import count_accepted, emit
from specsample.rules.residual import sample_residual
from specsample.rules.rows import LogitRows, ProbRows, flat_rows

__all__ = ["METHODS", "VerifyOutput", "verify", "verify_padded"]

METHODS = ("chain", "block")
"""Verification rules :func:`verify` accepts."""


class VerifyOutput(NamedTuple):
    """What :func:`verify` returns.

    Attributes
    ----------
    token_ids : torch.Tensor
        ``[batch, max_drafts + 1]`` int64: accepted drafts, then one more token, then -1.
    num_emitted : torch.Tensor
        ``[batch]`` int64: tokens emitted per request (accepted drafts plus one).
    logprobs : torch.Tensor or None
        ``[batch, max_drafts + 1]`` float32 log-probabilities of the emitted tokens under the
        processed target distribution (greedy requests: under ``softmax(logits)``); NaN at
        padding. ``None`` unless requested.
    """

    token_ids: torch.Tensor
    num_emitted: torch.Tensor
    logprobs: torch.Tensor | None


def _require(name: str, value: object) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _check_inputs(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    layout: BatchLayout,
    draft_rows: torch.Tensor | None,
    draft_name: str,
    strict: bool,
) -> None:
    if target_logits.dim() != 2:
        raise ValueError(
            "target_logits must have shape [total_drafts + batch, vocab], "
            f"got {tuple(target_logits.shape)}"
        )
    if target_logits.dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise TypeError(f"target_logits must be a floating tensor, got {target_logits.dtype}")
    if draft_token_ids.dim() != 1 or draft_token_ids.dtype not in (torch.int64, torch.int32):
        raise TypeError(
            f"draft_token_ids must be a 1-D int64 or int32 tensor, got {draft_token_ids.dtype} "
            f"of shape {tuple(draft_token_ids.shape)}"
        )
    rows, vocab = target_logits.shape
    total = layout.total_drafts
    if draft_token_ids.shape[0] != total:
        raise ValueError(
            f"num_draft_tokens adds up to {total} "
            f"but draft_token_ids has {draft_token_ids.shape[0]} entries"
        )
    if rows != total + layout.batch:
        raise ValueError(
            f"target_logits must have total_drafts + batch = {total + layout.batch} rows "
            f"(num_draft_tokens adds up to {total}, batch {layout.batch}), got {rows}"
        )
    if draft_token_ids.device != target_logits.device:
        raise ValueError(
            f"draft_token_ids is on {draft_token_ids.device} "
            f"but target_logits is on {target_logits.device}"
        )
    if draft_rows is not None:
        if draft_rows.shape != (total, vocab):
            raise ValueError(
                f"{draft_name} must have shape {(total, vocab)}, got {tuple(draft_rows.shape)}"
            )
        if draft_rows.device != target_logits.device:
            raise ValueError(
                f"{draft_name} is on {draft_rows.device} "
                f"but target_logits is on {target_logits.device}"
            )
        if not draft_rows.dtype.is_floating_point:
            raise TypeError(f"{draft_name} must be a floating tensor, got {draft_rows.dtype}")
    if strict:
        if bool(torch.isnan(target_logits).any()):
            raise ValueError("target_logits contains NaN")
        if total and bool(((draft_token_ids < 0) | (draft_token_ids >= vocab)).any()):
            raise ValueError(f"draft_token_ids must lie in [0, {vocab})")
        if draft_rows is not None and bool(torch.isnan(draft_rows).any()):
            raise ValueError(f"{draft_name} contains NaN")


def _per_row(
    values: Sequence[float], index: list[int], device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    return torch.tensor([values[i] for i in index], dtype=dtype).to(device, non_blocking=True)


def _target_stats(
    logits: torch.Tensor, meta: SamplingMetadata, layout: BatchLayout, need_norm: bool
) -> RowStats:
    """Row statistics of every target row, with each request's parameters (greedy: none)."""
    device = logits.device
    request = layout.target_request()
    inv_t = [1.0 / t if t > 0 else 1.0 for t in meta.temperature]
    return row_stats(
        logits,
        _per_row(inv_t, request, device, torch.float32),
        top_k=_per_row(meta.top_k, request, device, torch.int64) if meta.max_top_k else None,
        max_top_k=meta.max_top_k,
        top_p=_per_row(meta.top_p, request, device, torch.float32) if meta.any_top_p else None,
        min_p=_per_row(meta.min_p, request, device, torch.float32) if meta.any_min_p else None,
        need_norm=need_norm,
    )


def _log_q(
    logits: torch.Tensor, stats: RowStats, rows: torch.Tensor, ids: torch.Tensor
) -> torch.Tensor:
    """``log q(ids)`` at target ``rows`` (same shape), ``-inf`` where the token is filtered."""
    z = logits[rows, ids].to(torch.float32) * stats.inv_temperature[rows]
    return torch.where(z >= stats.cutoff[rows], z - stats.log_norm[rows], -torch.inf)


def _draft_side(
    draft_probs: torch.Tensor | None,
    draft_logits: torch.Tensor | None,
    draft_index: torch.Tensor,
    ids: torch.Tensor,
) -> tuple[ProbRows | LogitRows | None, torch.Tensor]:
    """The draft rows as a source for the residual, and ``p(ids)`` (float64) at the drafts.

    Without draft rows (or without any draft in the batch) the drafts are one-hot: no
    source, and ``p = 1`` at every draft.
    """
    if draft_probs is not None and draft_probs.shape[0]:
        return ProbRows(draft_probs), draft_probs[draft_index, ids].to(torch.float64)
    if draft_logits is not None and draft_logits.shape[0]:
        ones = torch.ones(draft_logits.shape[0], device=draft_logits.device)
        stats = row_stats(draft_logits, ones)
        log_p = draft_logits[draft_index, ids].to(torch.float32) - stats.log_norm[draft_index]
        return LogitRows(draft_logits, ones, stats.cutoff, stats.log_norm), log_p.exp().double()
    return None, torch.ones(ids.shape, dtype=torch.float64, device=ids.device)


def _positions_tensor(
    positions: Sequence[int] | torch.Tensor | None, batch: int, device: torch.device
) -> torch.Tensor | None:
    if positions is None:
        return None
    if not isinstance(positions, torch.Tensor):
        positions = torch.tensor([int(p) for p in positions], dtype=torch.int64)
    if (
        positions.shape != (batch,)
        or positions.dtype.is_floating_point
        or positions.dtype == torch.bool
    ):
        raise ValueError(
            f"positions must be integers of shape ({batch},), got {positions.dtype} "
            f"of shape {tuple(positions.shape)}"
        )
    return positions.to(device=device, dtype=torch.int64)


def _seeds_tensor(
    seeds: Sequence[int | None] | torch.Tensor | None, batch: int, device: torch.device
) -> torch.Tensor | None:
    if seeds is None:
        return None
    if isinstance(seeds, torch.Tensor):
        if seeds.shape != (batch,) or seeds.dtype.is_floating_point:
            raise ValueError(
                f"seeds must be an integer tensor of shape ({batch},), got {tuple(seeds.shape)}"
            )
        return seeds.to(device=device, dtype=torch.int64)
    values = [-1 if s is None else int(s) for s in seeds]
    if len(values) != batch:
        raise ValueError(f"seeds must have one entry per request ({batch}), got {len(values)}")
    if any(v < -1 for v in values):
        raise ValueError("seeds must be non-negative (None or -1: unseeded)")
    return torch.tensor(values, dtype=torch.int64).to(device, non_blocking=True)


def verify(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    num_draft_tokens: Sequence[int] | torch.Tensor,
    *,
    draft_probs: torch.Tensor | None = None,
    draft_logits: torch.Tensor | None = None,
    temperature: Scalars = 1.0,
    top_k: Scalars = None,
    top_p: Scalars = None,
    min_p: Scalars = None,
    seeds: Sequence[int | None] | torch.Tensor | None = None,
    positions: Sequence[int] | torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    method: str = "chain",
    return_logprobs: bool = False,
    strict: bool = False,
) -> VerifyOutput:
    """Verify the drafts of a flattened, ragged batch from target logits.

    Parameters
    ----------
    target_logits : torch.Tensor
        ``[total_drafts + batch, vocab]`` (float32, float16 or bfloat16): per request, the
        rows of its draft positions, then its bonus row.
    draft_token_ids : torch.Tensor
        ``[total_drafts]`` int64 drafts, request after request. Ids outside ``[0, vocab)``
        are rejected.
    num_draft_tokens : sequence of int or CPU tensor
        ``[batch]`` drafts per request (zeros allowed). Host-side metadata: it fixes the
        output width without a device synchronisation.
    draft_probs : torch.Tensor, optional
        ``[total_drafts, vocab]`` the distributions the drafts were sampled from.
    draft_logits : torch.Tensor, optional
        ``[total_drafts, vocab]`` logits whose softmax the drafts were sampled from.
        Exclusive with ``draft_probs``; with neither, drafts are one-hot.
    temperature, top_k, top_p, min_p : scalar, sequence or CPU tensor
        Per-request sampling parameters (host-side): temperature >= 0 (0 = greedy),
        top_k >= 0 (0 = off), top_p in (0, 1] (1 = off), min_p in [0, 1] (0 = off).
    seeds : sequence of (int or None), or tensor, optional
        ``[batch]`` per-request seeds (None or -1: unseeded). A seeded request's output
        depends only on its seed, its ``positions`` entry and its own rows: not on its index
        or on the other requests.
    positions : sequence of int or tensor, optional
        ``[batch]`` integer position of each request's first draft in its sequence (default
        0); a seeded step draws from its own stripe of counters keyed by
        ``(seed, position)`` (see :func:`specsample.random.step_uniforms`), so let positions
        increase from step to step.
    generator : torch.Generator, optional
        Randomness for unseeded requests.
    method : str
        Verification rule; one of :data:`METHODS`.
    return_logprobs : bool
        Also return the log-probabilities of the emitted tokens.
    strict : bool
        Also check values (NaN logits, ids out of range); this synchronises with the device.

    Returns
    -------
    VerifyOutput
        ``token_ids [batch, max_drafts + 1]``, ``num_emitted [batch]``, and ``logprobs``.

    Examples
    --------
    >>> import torch
    >>> logits = torch.tensor([[0.0, 9.0], [9.0, 0.0], [0.0, 9.0], [9.0, 0.0]])
    >>> out = verify(logits, torch.tensor([1, 0]), [2, 0], temperature=0.0)
    >>> out.token_ids.tolist(), out.num_emitted.tolist()
    ([[1, 0, 1], [0, -1, -1]], [3, 1])
    """
    target_logits = _require("target_logits", target_logits)
    draft_token_ids = _require("draft_token_ids", draft_token_ids)
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if draft_probs is not None and draft_logits is not None:
        raise ValueError("pass draft_probs or draft_logits, not both")
    device = target_logits.device
    layout = BatchLayout.build(num_draft_tokens, device)
    meta = SamplingMetadata.build(
        layout.batch, temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p
    )
    draft_rows = draft_probs if draft_probs is not None else draft_logits
    draft_name = "draft_probs" if draft_probs is not None else "draft_logits"
    _check_inputs(target_logits, draft_token_ids, layout, draft_rows, draft_name, strict)
    seed_t = _seeds_tensor(seeds, layout.batch, device)
    positions = _positions_tensor(positions, layout.batch, device)

    stats = _target_stats(target_logits, meta, layout, not meta.all_greedy or return_logprobs)
    greedy = torch.tensor([t == 0.0 for t in meta.temperature]).to(device, non_blocking=True)
    uniforms = None
    if not meta.all_greedy:
        uniforms = step_uniforms(
            layout.batch, layout.max_drafts, device, generator, seed_t, positions
        )
    rows = kernels.verify_logits if target_logits.is_cuda and kernels.available() else _verify_rows
    token_ids, num_accepted = rows(
        target_logits,
        draft_token_ids,
        layout,
        stats,
        greedy,
        uniforms,
        draft_probs=draft_probs,
        draft_logits=draft_logits,
        method=method,
    )
    logprobs = None
    if return_logprobs:
        logprobs = _emitted_logprobs(target_logits, stats, layout, token_ids)
    return VerifyOutput(token_ids, num_accepted + 1, logprobs)


def _verify_rows(
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
) -> tuple[torch.Tensor, torch.Tensor]:
    """The step after the row statistics, in PyTorch: ``(token_ids, num_accepted)``.

    The reference, and the path on CPU; :func:`specsample.kernels.verify_logits` is its
    fused twin for CUDA tensors (same arguments, same results on the same uniforms).
    """
    drafts = _padded_drafts(draft_token_ids, layout, target_logits.shape[-1])
    usable = ~torch.isnan(stats.cutoff[drafts.target_rows])
    greedy_ok = (drafts.ids == stats.argmax[drafts.target_rows]) & usable
    num_accepted = count_accepted(greedy_ok & drafts.valid)
    final = stats.argmax[layout.target_start + num_accepted]
    if uniforms is not None:
        source, p_at = _draft_side(draft_probs, draft_logits, drafts.draft_rows, drafts.safe_ids)
        q_at = _log_q(target_logits, stats, drafts.target_rows, drafts.safe_ids).exp().double()
        target = LogitRows(target_logits, *stats[:3])
        step = _block_step if method == "block" and layout.total_drafts else _chain_step
        sampled, drawn = step(target, source, q_at, p_at, uniforms, layout, drafts)
        num_accepted = torch.where(greedy, num_accepted, sampled)
        final = torch.where(greedy, final, drawn)
    return emit(drafts.ids, num_accepted, final), num_accepted


class _Drafts(NamedTuple):
    """The drafts of a step, padded to ``[batch, max_drafts]``."""

    ids: torch.Tensor
    safe_ids: torch.Tensor
    valid: torch.Tensor
    draft_rows: torch.Tensor
    target_rows: torch.Tensor


def _padded_drafts(draft_token_ids: torch.Tensor, layout: BatchLayout, vocab: int) -> _Drafts:
    """Pad the flat drafts; ``valid`` marks real drafts whose id lies in the vocabulary."""
    device = draft_token_ids.device
    cols = torch.arange(layout.max_drafts, device=device)
    in_request = cols < layout.num_drafts_t.unsqueeze(-1)
    draft_rows = (layout.draft_start.unsqueeze(-1) + cols).clamp_(
        max=max(layout.total_drafts - 1, 0)
    )
    target_rows = (layout.target_start.unsqueeze(-1) + cols).clamp_(
        max=layout.total_drafts + layout.batch - 1
    )
    if layout.total_drafts:
        ids = torch.where(in_request, draft_token_ids.to(torch.int64)[draft_rows], -1)
    else:
        ids = torch.full((layout.batch, layout.max_drafts), -1, dtype=torch.int64, device=device)
    valid = in_request & (ids >= 0) & (ids < vocab)
    return _Drafts(ids, ids.clamp(0, vocab - 1), valid, draft_rows, target_rows)


def _chain_step(
    target: LogitRows,
    source: ProbRows | LogitRows | None,
    q_at: torch.Tensor,
    p_at: torch.Tensor,
    uniforms: torch.Tensor,
    layout: BatchLayout,
    drafts: _Drafts,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token-by-token rule: accepted counts, and the residual or bonus draw after them."""
    num_accepted = count_accepted((uniforms[:, :-1] * p_at < q_at) & drafts.valid)
    selected = target.select(layout.target_start + num_accepted)
    vocab = target.logits.shape[-1]
    rejected = num_accepted < layout.num_drafts_t
    if source is None:
        if not layout.max_drafts:
            return num_accepted, sample_residual(selected, uniforms[:, -1], vocab)
        at = num_accepted.clamp(max=layout.max_drafts - 1).unsqueeze(-1)
        token = torch.where(rejected, drafts.ids.gather(1, at).squeeze(-1), -1)
        return num_accepted, sample_residual(selected, uniforms[:, -1], vocab, draft_token=token)
    row = (layout.draft_start + num_accepted).clamp_(max=max(layout.total_drafts - 1, 0))
    drawn = sample_residual(
        selected,
        uniforms[:, -1],
        vocab,
        draft=source.select(row),
        draft_weight=rejected.to(torch.float32),
    )
    return num_accepted, drawn


def _block_step(
    target: LogitRows,
    source: ProbRows | LogitRows | None,
    q_at: torch.Tensor,
    p_at: torch.Tensor,
    uniforms: torch.Tensor,
    layout: BatchLayout,
    drafts: _Drafts,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block rule: accepted lengths, and the draw at row ``tau`` (the bonus row if all pass).

    The block masses of every target row of the batch, bonus rows included, are computed
    once: the ``Z_i`` read the draft rows, and the final draw reuses the masses of row ``tau``.
    """
    if source is None:
        raise ValueError(
            "method='block' needs draft_probs or draft_logits: with one-hot drafts it accepts "
            "exactly as many tokens in expectation as method='chain'"
        )
    vocab = target.logits.shape[-1]
    width = layout.max_drafts
    weights = block_weights(q_at, p_at, drafts.valid)
    cols = torch.arange(width + 1, device=q_at.device)
    last_target = layout.total_drafts + layout.batch - 1
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
    tau = block_length(weights, residual[:, :width], layout.num_drafts_t, uniforms[:, :-1])
    row_masses = masses.gather(2, tau.view(1, -1, 1, 1).expand(2, -1, 1, masses.shape[-1])).squeeze(
        2
    )
    drawn = sample_residual(
        target.select(layout.target_start + tau),
        uniforms[:, -1],
        vocab,
        draft=source.select(draft_rows.gather(1, tau.unsqueeze(-1)).squeeze(-1)),
        draft_weight=(tau < layout.num_drafts_t).to(torch.float32),
        target_scale=weights.gather(1, tau.unsqueeze(-1)).squeeze(-1).to(torch.float32),
        masses=row_masses,
    )
    return tau, drawn


def _emitted_logprobs(
    logits: torch.Tensor, stats: RowStats, layout: BatchLayout, token_ids: torch.Tensor
) -> torch.Tensor:
    """``log q`` of each emitted token at its own target row; NaN at padding."""
    cols = torch.arange(token_ids.shape[-1], device=token_ids.device)
    rows = (layout.target_start.unsqueeze(-1) + cols).clamp_(max=logits.shape[0] - 1)
    logprobs = _log_q(logits, stats, rows, token_ids.clamp(min=0))
    return logprobs.masked_fill_(token_ids < 0, torch.nan)


def verify_padded(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    *,
    draft_probs: torch.Tensor | None = None,
    draft_logits: torch.Tensor | None = None,
    **kwargs: object,
) -> VerifyOutput:
    """:func:`verify` for a padded batch with ``k`` drafts per request.

    Parameters
    ----------
    target_logits : torch.Tensor
        ``[batch, k + 1, vocab]``: the ``k`` draft positions, then the bonus position.
    draft_token_ids : torch.Tensor
        ``[batch, k]`` int64.
    draft_probs, draft_logits : torch.Tensor, optional
        ``[batch, k, vocab]``.
    **kwargs
        Any other argument of :func:`verify`.

    Examples
    --------
    >>> import torch
    >>> logits = torch.tensor([[[0.0, 9.0], [9.0, 0.0]]])
    >>> verify_padded(logits, torch.tensor([[1]]), temperature=0.0).token_ids.tolist()
    [[1, 0]]
    """
    target_logits = _require("target_logits", target_logits)
    draft_token_ids = _require("draft_token_ids", draft_token_ids)
    if target_logits.dim() != 3:
        raise ValueError(
            f"target_logits must have shape [batch, k + 1, vocab], got {tuple(target_logits.shape)}"
        )
    batch, k_plus_one, vocab = target_logits.shape
    if draft_token_ids.shape != (batch, k_plus_one - 1):
        raise ValueError(
            f"draft_token_ids must have shape {(batch, k_plus_one - 1)}, "
            f"got {tuple(draft_token_ids.shape)}"
        )
    flat_target, _ = flat_rows(target_logits)
    if flat_target.shape[0] != batch * k_plus_one:
        flat_target = target_logits.reshape(batch * k_plus_one, vocab)
    flat_draft = {}
    for name, rows in (("draft_probs", draft_probs), ("draft_logits", draft_logits)):
        if rows is not None:
            flat_draft[name] = _require(name, rows).reshape(-1, vocab)
    return verify(
        flat_target,
        draft_token_ids.reshape(-1),
        [k_plus_one - 1] * batch,
        **flat_draft,  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )
