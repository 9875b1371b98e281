"""A naive, exact reference for chain verification, written for clarity rather than speed.

:func:`naive_rejection_sample` performs speculative (rejection) sampling the way the classic
batched implementations do: every step runs on all ``k`` draft positions at once, so the
residual distribution ``normalize(max(0, q - p))`` is built for *every* position
(``[batch, k, vocab]`` temporaries) although at most one position per sequence is used, and
a recovered token is drawn for every position by an exponential race over the whole
vocabulary. It is the baseline of the benchmarks and a second, independent verifier for the
tests. Unlike those implementations it is exact: nothing is clamped to a tiny positive value,
and a residual with no mass falls back to the target row.
"""

from __future__ import annotations

import torch

from specsample.params.checks import check_chain_inputs


def naive_rejection_sample(
    target_probs: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """Accept a prefix of each sequence's drafts and emit one more token, naively but exactly.

    The steps, each applied to all ``k`` positions at once:

    1. accept test: draft ``x_i`` passes when ``u_i * p_i(x_i) < q_i(x_i)`` with
       ``u_i ~ U[0, 1)`` drawn in float64, i.e. with probability ``min(1, q_i(x_i) / p_i(x_i))``;
       ids outside ``[0, vocab)`` never pass;
    2. residual: ``r_i = normalize(max(0, q_i - p_i))`` for every position, ``[batch, k, vocab]``,
       computed in float32 (float64 inputs stay float64); a row whose residual sums to zero
       (``q_i <= p_i`` everywhere) uses ``q_i`` instead;
    3. recovered tokens: ``argmax(r_i / e_i)`` with ``e_i ~ Exp(1)`` i.i.d. over the vocabulary,
       which picks token ``x`` with probability ``r_i(x)``; the noise is drawn in float64 so
       that a zero draw (which would let a token win regardless of its weight) has probability
       ``2**-53`` rather than ``2**-24``, and zero-weight tokens are excluded outright;
    4. layout: the drafts before the first rejection, then the recovered token of that
       position (or the bonus token when all ``k`` passed), then ``-1``.

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[batch, k, vocab]`` target probabilities ``q`` (float32, float16, bfloat16 or
        float64).
    bonus_token_ids : torch.Tensor
        ``[batch, 1]`` or ``[batch]`` int64 (or int32) token emitted when all ``k`` drafts pass.
    draft_probs : torch.Tensor
        ``[batch, k, vocab]`` draft probabilities ``p`` the drafts were sampled from, same dtype
        and device as ``target_probs``.
    draft_token_ids : torch.Tensor
        ``[batch, k]`` int64 (or int32) drafted tokens.
    generator : torch.Generator, optional
        Source of the uniforms and the exponential noise (torch's default generator otherwise);
        it must live on the device of the inputs.

    Returns
    -------
    torch.Tensor
        ``[batch, k + 1]`` int64: accepted drafts, then the recovered token at the first
        rejection (or the bonus token), then ``-1`` padding.

    Raises
    ------
    TypeError
        An argument is not a tensor or has the wrong dtype.
    ValueError
        An argument has the wrong shape or lives on another device.

    Examples
    --------
    >>> import torch
    >>> q = torch.tensor([[[0.0, 1.0, 0.0], [0.0, 0.0, 1.0]]])
    >>> p = torch.tensor([[[0.0, 1.0, 0.0], [1.0, 0.0, 0.0]]])
    >>> naive_rejection_sample(q, torch.tensor([[1]]), p, torch.tensor([[1, 0]]))
    tensor([[ 1,  2, -1]])
    """
    check_chain_inputs(target_probs, bonus_token_ids, draft_probs, draft_token_ids)
    batch, k, vocab = target_probs.shape
    device = target_probs.device
    bonus = bonus_token_ids.reshape(batch).to(torch.int64)
    if k == 0:
        return bonus.unsqueeze(-1)
    ids = draft_token_ids.to(torch.int64)
    work_dtype = torch.promote_types(target_probs.dtype, torch.float32)
    q = target_probs.to(work_dtype)
    p = draft_probs.to(work_dtype)

    in_vocab = (ids >= 0) & (ids < vocab)
    safe_ids = ids.clamp(0, vocab - 1).unsqueeze(-1)
    q_at = q.gather(2, safe_ids).squeeze(-1).to(torch.float64)
    p_at = p.gather(2, safe_ids).squeeze(-1).to(torch.float64)
    u = torch.rand(batch, k, dtype=torch.float64, device=device, generator=generator)
    accepted = (u * p_at < q_at) & in_vocab

    residual = (q - p).clamp(min=0.0)
    mass = residual.sum(dim=-1, keepdim=True)
    residual = torch.where(mass > 0, residual, q)
    residual = residual / residual.sum(dim=-1, keepdim=True)

    noise = torch.empty(batch, k, vocab, dtype=torch.float64, device=device)
    noise.exponential_(generator=generator)
    scores = (residual / noise).masked_fill(residual <= 0, -1.0)
    recovered = scores.argmax(dim=-1)

    num_accepted = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)
    at_rejection = recovered.gather(1, num_accepted.clamp(max=k - 1).unsqueeze(-1)).squeeze(-1)
    last = torch.where(num_accepted == k, bonus, at_rejection)

    cols = torch.arange(k + 1, device=device).unsqueeze(0)
    n = num_accepted.unsqueeze(-1)
    padded_ids = torch.cat([ids, ids.new_full((batch, 1), -1)], dim=1)
    out = torch.where(cols < n, padded_ids, torch.full_like(padded_ids, -1))
    return torch.where(cols == n, last.unsqueeze(-1), out)
