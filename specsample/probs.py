"""From logits to the processed target distribution, without materialising it.

The distribution a sampled request follows is the softmax of its logits after, in this
order:

1. **temperature** ``T``: ``z = logits / T``;
2. **top-k**: keep the tokens with ``z >= `` the ``k``-th largest ``z`` (ties at the
   threshold are all kept);
3. **top-p**: of what remains, keep the tokens with ``z >= `` the value of the last token
   of the smallest prefix, in decreasing order, whose probability (renormalised after
   top-k) reaches ``top_p`` (ties at the threshold are all kept);
4. **min-p**: keep the tokens whose probability is at least ``min_p`` times the largest
   (``z >= max(z) + log(min_p)``);

then renormalise. Each filter keeps the tokens above a threshold on ``z`` and always keeps
the most likely token, so the whole processing is summarised per row by four numbers:
``inv_temperature``, ``shift`` (the row's largest logit), ``cutoff`` (the largest of the
thresholds) and ``log_norm`` (the log-sum-exp of the kept ``z``), with ``z`` measured from
the largest logit, ``z = (logits - shift) / T`` (:func:`scaled_logits`): ``q(x) =
exp(z(x) - log_norm)`` where ``z(x) >= cutoff``, else 0. Measuring from the largest logit
keeps ``z <= 0``, so no logit and no temperature overflows float32 (a logit of ``3e38`` at
``T = 0.5`` is as good as any). :func:`row_norms` computes the summary in row chunks, so no
``[rows, vocab]`` temporary larger than a chunk exists; :func:`processed_probs`
materialises the distribution (a reference, and the naive path of the benchmark).

Infinite and missing values. A ``+inf`` logit is the largest: a greedy row emits it, and a
sampled row's distribution is uniform over its ``+inf`` tokens (the limit of the softmax as
those logits grow), every finite token having probability 0. A row with a NaN logit, or
whose logits are all ``-inf``, has no distribution: its ``cutoff`` is NaN, so no token is
kept and every token has probability 0, and its ``argmax`` is 0. A verifier rejects every
draft at such a row, greedy or sampled, and emits token id 0 there (``strict=True`` refuses
NaN logits instead).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from specsample.params.metadata import SamplingMetadata

_CPU_CHUNK_ELEMENTS = 1 << 20
_DEVICE_CHUNK_ELEMENTS = 1 << 27


class RowNorms(NamedTuple):
    """Per-row summary of a processed distribution (each ``[rows]``).

    Attributes
    ----------
    inv_temperature : torch.Tensor
        float32 ``1 / T`` (1 for greedy rows).
    cutoff : torch.Tensor
        float32 threshold on ``z``; ``-inf`` when no filter applies, NaN for a row without a
        distribution (its largest logit is not finite: all ``-inf``, NaN or ``+inf``).
    log_norm : torch.Tensor
        float32 log-sum-exp of the kept ``z`` (``+inf`` for rows without a distribution;
        ``nan`` when not computed, see ``need_norm`` of :func:`row_norms`).
    argmax : torch.Tensor
        int64 index of the largest logit (the first one on ties; 0 for a row without a
        distribution).
    shift : torch.Tensor
        float32 the row's largest logit (``+inf`` allowed; 0 for a row without a
        distribution, or when ``log_norm`` is not computed): ``z`` is measured from it
        (see :func:`scaled_logits`).
    lazy : torch.Tensor or None
        ``[rows]`` bool: the rows whose shift, argmax, cutoff and log-norm are left to the
        step that reads them (their values here are not read), so that a row no walk reaches
        is never read; ``None`` when every row's statistics are here. Only a backend's own
        row statistics leave rows to its steps (:mod:`specsample.backends.cpu`).
    """

    inv_temperature: torch.Tensor
    cutoff: torch.Tensor
    log_norm: torch.Tensor
    argmax: torch.Tensor
    shift: torch.Tensor
    lazy: torch.Tensor | None = None


def _chunk_rows(vocab: int, device: torch.device) -> int:
    budget = _CPU_CHUNK_ELEMENTS if device.type == "cpu" else _DEVICE_CHUNK_ELEMENTS
    return max(1, budget // max(vocab, 1))


def _top_p_threshold(z: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Threshold on ``z [rows, vocab]`` (already -inf outside earlier filters) for top-p: the
    ``z`` at the first position, in decreasing order, where the cumulative mass reaches
    ``top_p`` of the total. The masses are float32 exponentials summed in float64, so the
    threshold does not hang on the order of a float32 sum's additions."""
    ordered = z.sort(dim=-1, descending=True).values
    cum = ordered.exp().double().cumsum(dim=-1)
    wanted = top_p.double().unsqueeze(-1) * cum[:, -1:]
    last = (cum < wanted).sum(dim=-1, keepdim=True).clamp_(max=z.shape[-1] - 1)
    return ordered.gather(1, last).squeeze(-1)


def _row_chunks(rows: int, vocab: int, device: torch.device) -> list[tuple[int, int]]:
    """Row ranges small enough to stay in cache; one range under :func:`torch.compile`, where
    a count of chunks would be a guard on the number of rows (a recompilation per total)."""
    if torch.compiler.is_compiling():
        return [(0, rows)]
    step = _chunk_rows(vocab, device)
    return [(start, min(start + step, rows)) for start in range(0, rows, step)]


def row_norms(
    logits: torch.Tensor,
    inv_temperature: torch.Tensor,
    *,
    top_k: torch.Tensor | None = None,
    max_top_k: int | None = 0,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
    need_norm: bool = True,
) -> RowNorms:
    """Summarise each row's processed distribution, reading the logits once per chunk.

    Parameters
    ----------
    logits : torch.Tensor
        ``[rows, vocab]`` float32, float16 or bfloat16.
    inv_temperature : torch.Tensor
        ``[rows]`` float32 ``1 / T`` (use 1 for greedy rows).
    top_k : torch.Tensor, optional
        ``[rows]`` int64, 0 = off.
    max_top_k : int or None
        The largest entry of ``top_k`` when known on the host (0: top-k is off); ``None``
        when it is not known (the k-th largest is then found by sorting whole rows).
    top_p : torch.Tensor, optional
        ``[rows]`` float32 in ``(0, 1]``, 1 = off.
    min_p : torch.Tensor, optional
        ``[rows]`` float32 in ``[0, 1]``, 0 = off.
    need_norm : bool
        Compute ``log_norm`` (skip it, and every ``exp``, when only the argmax is needed).

    Returns
    -------
    RowNorms

    Examples
    --------
    >>> import torch
    >>> logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    >>> s = row_norms(logits, torch.ones(1), top_k=torch.tensor([2]), max_top_k=2)
    >>> s.shift.tolist(), s.cutoff.tolist(), s.argmax.tolist(), round(float(s.log_norm), 4)
    ([3.0], [-1.0], [1], 0.3133)
    """
    if logits.dim() == 2 and logits.shape[-1] > 1 and logits.stride(-1) != 1:
        logits = logits.contiguous()
    rows, vocab = logits.shape
    device = logits.device
    cutoff = torch.full((rows,), -math.inf, dtype=torch.float32, device=device)
    log_norm = torch.full((rows,), math.nan, dtype=torch.float32, device=device)
    shift = torch.zeros(rows, dtype=torch.float32, device=device)
    argmax = torch.empty(rows, dtype=torch.int64, device=device)
    for start, stop in _row_chunks(rows, vocab, device):
        top, index = logits[start:stop].max(dim=-1)
        usable = ~torch.isnan(top) & (top > -math.inf)
        argmax[start:stop] = torch.where(usable, index, 0)
        if not need_norm:
            cutoff[start:stop] = torch.where(usable, -math.inf, math.nan)
            continue
        shift[start:stop] = torch.where(usable, top.to(torch.float32), 0.0)
        z = scaled_logits(
            logits[start:stop], shift[start:stop, None], inv_temperature[start:stop, None]
        )
        cut = _cutoff(z, cutoff[start:stop], start, stop, top_k, max_top_k, top_p, min_p)
        cutoff[start:stop] = torch.where(usable, cut, math.nan)
        dropped = (z >= cut.unsqueeze(-1)).logical_not_()
        total = z.exp_().masked_fill_(dropped, 0.0).sum(dim=-1)
        log_norm[start:stop] = torch.where(usable, total.log(), math.inf)
        del z, dropped
    return RowNorms(inv_temperature, cutoff, log_norm, argmax, shift)


def _cutoff(
    z: torch.Tensor,
    cut: torch.Tensor,
    start: int,
    stop: int,
    top_k: torch.Tensor | None,
    max_top_k: int | None,
    top_p: torch.Tensor | None,
    min_p: torch.Tensor | None,
) -> torch.Tensor:
    """The largest of the filters' thresholds on the shifted ``z [rows, vocab]`` (max 0)."""
    vocab = z.shape[-1]
    if max_top_k != 0 and top_k is not None:
        kth = z.topk(vocab if max_top_k is None else min(max_top_k, vocab), dim=-1).values
        k = top_k[start:stop]
        at_k = kth.gather(1, (k - 1).clamp(0, kth.shape[-1] - 1).unsqueeze(-1)).squeeze(-1)
        cut = torch.maximum(cut, torch.where(k > 0, at_k, -math.inf))
    if top_p is not None:
        p = top_p[start:stop]
        kept = z.masked_fill(z < cut.unsqueeze(-1), -math.inf)
        cut = torch.maximum(cut, torch.where(p < 1.0, _top_p_threshold(kept, p), -math.inf))
    if min_p is not None:
        m = min_p[start:stop]
        cut = torch.maximum(cut, torch.where(m > 0.0, torch.log(m), -math.inf))
    return cut


def scaled_logits(
    logits: torch.Tensor, shift: torch.Tensor, inv_temperature: torch.Tensor
) -> torch.Tensor:
    """``z = (logits - shift) * inv_temperature`` in float32, 0 where ``logits == shift``.

    ``shift`` is the row's largest logit (see :class:`RowNorms`), so ``z <= 0`` never
    overflows, whatever the logits and the temperature, and a ``+inf`` logit (the largest)
    has ``z = 0`` while every finite one has ``z = -inf``. The arguments broadcast.

    Examples
    --------
    >>> import math, torch
    >>> scaled_logits(torch.tensor([3e38, 1.0, math.inf]), torch.tensor(math.inf), 2.0)
    tensor([-inf, -inf, 0.])
    """
    z = torch.sub(logits.to(torch.float32), shift).mul_(inv_temperature)
    return z.nan_to_num_(nan=0.0, posinf=0.0, neginf=-math.inf)


def sampling_norms(
    logits: torch.Tensor, sampling: SamplingMetadata, *, need_norm: bool = True
) -> RowNorms:
    """:func:`row_norms` of each row with the parameters of ``sampling`` (one per row).

    Examples
    --------
    >>> import torch
    >>> meta = SamplingMetadata.build(1, torch.device("cpu"), top_k=2)
    >>> sampling_norms(torch.tensor([[1.0, 3.0, 2.0, 0.0]]), meta).cutoff.tolist()
    [-1.0]
    """
    return row_norms(
        logits,
        sampling.inv_temperature,
        top_k=sampling.top_k,
        max_top_k=sampling.max_top_k,
        top_p=sampling.top_p,
        min_p=sampling.min_p,
        need_norm=need_norm,
    )


def processed_probs(
    logits: torch.Tensor,
    sampling: SamplingMetadata | torch.Tensor,
    *,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    min_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """Materialise the processed distribution of every row (the reference definition).

    Parameters
    ----------
    logits : torch.Tensor
        ``[rows, vocab]``.
    sampling : SamplingMetadata or torch.Tensor
        One set of parameters per row, or the ``[rows]`` temperatures (0 gives the one-hot
        distribution of the argmax: greedy) with the filters below.
    top_k, top_p, min_p : torch.Tensor, optional
        ``[rows]`` filters as in :func:`row_norms` (0, 1 and 0 switch them off); only with
        temperatures.

    Returns
    -------
    torch.Tensor
        ``[rows, vocab]`` float32 probabilities.

    Examples
    --------
    >>> import torch
    >>> processed_probs(torch.tensor([[0.0, 0.0, 5.0]]), torch.tensor([0.0]))
    tensor([[0., 0., 1.]])
    """
    if isinstance(sampling, torch.Tensor):
        sampling = SamplingMetadata.build(
            logits.shape[0],
            logits.device,
            temperature=sampling,
            top_k=top_k,
            top_p=top_p,
            min_p=min_p,
        )
    elif top_k is not None or top_p is not None or min_p is not None:
        raise ValueError("pass top_k, top_p and min_p inside sampling, not beside it")
    if sampling.top_k is None and sampling.top_p is None and sampling.min_p is None:
        probs, argmax = _unfiltered(logits, sampling.inv_temperature)
    else:
        norms = sampling_norms(logits, sampling)
        z = scaled_logits(logits, norms.shift[:, None], norms.inv_temperature[:, None])
        dropped = (z >= norms.cutoff.unsqueeze(-1)).logical_not_()
        probs = z.sub_(norms.log_norm.unsqueeze(-1)).exp_().masked_fill_(dropped, 0.0)
        argmax = norms.argmax
    if not sampling.any_greedy:
        return probs
    onehot = torch.nn.functional.one_hot(argmax, logits.shape[-1]).to(torch.float32)
    return torch.where(sampling.greedy.unsqueeze(-1), onehot, probs)


def request_probs(logits: torch.Tensor, sampling: SamplingMetadata) -> torch.Tensor:
    """:func:`processed_probs` of ``[batch, slots, vocab]`` logits, every row with its
    request's parameters (request ``b`` owns the slots ``logits[b]``).

    Examples
    --------
    >>> import torch
    >>> meta = SamplingMetadata.build(2, torch.device("cpu"), temperature=[0.0, 1.0])
    >>> request_probs(torch.tensor([[[0.0, 1.0]], [[0.0, 0.0]]]), meta).tolist()
    [[[0.0, 1.0]], [[0.5, 0.5]]]
    """
    batch, slots, vocab = logits.shape
    request = torch.arange(batch, device=logits.device).repeat_interleave(slots)
    flat = logits.reshape(batch * slots, vocab)
    return processed_probs(flat, sampling.rows(request)).view(batch, slots, vocab)


def _unfiltered(
    logits: torch.Tensor, inv_temperature: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[rows, vocab]`` probabilities with temperature alone, and ``[rows]`` argmaxes.

    The softmax of :func:`scaled_logits` (what :func:`processed_probs` computes through
    :func:`row_norms` when a filter is on, in fewer passes); a row without a distribution
    (NaN, or nothing above ``-inf``) is all zeros with argmax 0.
    """
    top, index = logits.max(dim=-1)
    usable = ~torch.isnan(top) & (top > -math.inf)
    shift = torch.where(usable, top.to(torch.float32), 0.0)
    z = scaled_logits(logits, shift[:, None], inv_temperature[:, None])
    probs = torch.softmax(z, dim=-1).masked_fill_(usable.logical_not().unsqueeze(-1), 0.0)
    return probs, torch.where(usable, index, 0)
