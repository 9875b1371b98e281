"""Drafter-invariant verification (``method="gumbel"``): accept a draft when it is the
target's own keyed Gumbel-max token.

At every target row the target's token is ``argmax_v (z_v + g_v)`` over the tokens its
request's processing keeps (``z`` the scaled logits of :func:`specsample.probs.scaled_logits`,
``g`` the keyed noise of :mod:`specsample.noise`): an exact sample of the processed target
distribution. Drafts are accepted while they equal those tokens; the first mismatch emits the
target's token there, and a request that matches every draft emits the token of its bonus row
(or the bonus token given). The emitted tokens are therefore the target's own seeded samples,
whatever drafted them: a draft model proposing ``argmax`` of its own processed logits plus the
same noise is accepted with probability at least ``(1 - TV) / (1 + TV)`` (``TV`` the total
variation between the two processed distributions), one-hot drafts (n-gram) with probability
``q(x)``, as in rejection sampling. Greedy requests follow the argmax, as in every method.

A row without a distribution (NaN logits, or nothing above ``-inf``) emits token 0 and rejects
its draft, as the other methods do.
"""

from __future__ import annotations

import math

import torch

from specsample.noise import gumbel_noise
from specsample.probs import RowNorms, scaled_logits
from specsample.rules.chain import VerifyResult

_CPU_CHUNK_ELEMENTS = 1 << 20
_DEVICE_CHUNK_ELEMENTS = 1 << 26


def _chunks(rows: int, vocab: int, device: torch.device) -> list[tuple[int, int]]:
    """Row ranges of at most a chunk of float64 scores; one range under :func:`torch.compile`."""
    if torch.compiler.is_compiling():
        return [(0, rows)]
    budget = _CPU_CHUNK_ELEMENTS if device.type == "cpu" else _DEVICE_CHUNK_ELEMENTS
    step = max(1, budget // max(vocab, 1))
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


def gumbel_argmax(logits: torch.Tensor, norms: RowNorms, keys: torch.Tensor) -> torch.Tensor:
    """Each row's keyed Gumbel-max token over the tokens its processing keeps.

    Parameters
    ----------
    logits : torch.Tensor
        ``[rows, vocab]`` float32, float16, bfloat16 or float64 logits.
    norms : RowNorms
        ``[rows]`` their statistics (``shift`` and ``cutoff`` read; computed with the
        normalisers, :func:`specsample.probs.row_norms`).
    keys : torch.Tensor
        ``[rows]`` int64 row keys (:func:`specsample.noise.row_keys`).

    Returns
    -------
    torch.Tensor
        ``[rows]`` int64 ``argmax_v (z_v + g_v)`` over ``z_v >= cutoff`` (the first on
        ties; 0 for a row without a distribution).

    Examples
    --------
    >>> from specsample.noise import row_keys
    >>> from specsample.probs import row_norms
    >>> logits = torch.tensor([[0.0, 50.0, 0.0], [0.0, 0.0, -math.inf]])
    >>> keys = row_keys(torch.tensor([1, 2]), torch.tensor([0, 0]))
    >>> gumbel_argmax(logits, row_norms(logits, torch.ones(2)), keys)[0].item()
    1
    """
    rows, vocab = logits.shape
    out = torch.zeros(rows, dtype=torch.int64, device=logits.device)
    for start, stop in _chunks(rows, vocab, logits.device):
        z = scaled_logits(
            logits[start:stop],
            norms.shift[start:stop, None],
            norms.inv_temperature[start:stop, None],
        )
        kept = z >= norms.cutoff[start:stop, None]
        score = gumbel_noise(keys[start:stop], 0, vocab).add_(z)
        out[start:stop] = score.masked_fill_(kept.logical_not_(), -math.inf).argmax(dim=-1)
    return out


def gumbel_probs(
    target_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    keys: torch.Tensor,
) -> VerifyResult:
    """The rule on ``[batch, k, vocab]`` probabilities: target tokens ``argmax log q + g``.

    Parameters
    ----------
    target_probs : torch.Tensor
        ``[batch, k, vocab]`` processed target probabilities.
    draft_token_ids : torch.Tensor
        ``[batch, k]`` int64 drafts (ids outside the vocabulary are rejected).
    bonus_token_ids : torch.Tensor
        ``[batch, 1]`` int64 tokens emitted when every draft is accepted.
    keys : torch.Tensor
        ``[batch, k]`` int64 row keys of the ``k`` positions.

    Returns
    -------
    VerifyResult
        ``[batch, k + 1]`` tokens and ``[batch]`` accepted counts.

    Examples
    --------
    >>> probs = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])
    >>> keys = torch.zeros(1, 2, dtype=torch.int64)
    >>> out = gumbel_probs(probs, torch.tensor([[1, 1]]), torch.tensor([[1]]), keys)
    >>> out.token_ids.tolist(), out.num_accepted.tolist()
    ([[1, 0, -1]], [1])
    """
    batch, k, vocab = target_probs.shape
    rows = target_probs.reshape(batch * k, vocab)
    tokens = torch.zeros(batch * k, dtype=torch.int64, device=rows.device)
    flat_keys = keys.reshape(-1)
    for start, stop in _chunks(batch * k, vocab, rows.device):
        chunk = rows[start:stop].to(torch.float64)
        score = gumbel_noise(flat_keys[start:stop], 0, vocab).add_(chunk.log())
        tokens[start:stop] = score.masked_fill_(chunk.isnan(), -math.inf).argmax(dim=-1)
    tokens = tokens.view(batch, k)
    ids = draft_token_ids.to(torch.int64)
    match = (ids == tokens).to(torch.int64)
    num_accepted = match.cumprod(dim=1).sum(dim=1)
    last = torch.cat([tokens, bonus_token_ids.reshape(batch, 1).to(torch.int64)], dim=1)
    final = last.gather(1, num_accepted.unsqueeze(-1))
    cols = torch.arange(k + 1, device=ids.device)
    padded = torch.cat([ids, ids.new_full((batch, 1), -1)], dim=1)
    out = torch.where(cols < num_accepted.unsqueeze(-1), padded, -1)
    return VerifyResult(out.scatter_(1, num_accepted.unsqueeze(-1), final), num_accepted)
