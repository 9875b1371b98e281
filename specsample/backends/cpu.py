"""The fused CPU backend: the numba kernels of :mod:`specsample.kernels.cpu` behind the seam.

* The chain rule on ``[batch, k, vocab]`` probabilities (what :class:`specsample.RejectionSampler`
  runs): one fused pass per sequence (:func:`specsample.kernels.cpu.chain.chain_rule`).
* A chain step on flattened logits (what :func:`specsample.verify` and the generation loop
  run): the row statistics (:func:`row_stats`; the largest logit and normaliser of a sampled
  row without a filter only for the rows the rule reads, the thresholds of top-k, top-p and
  min-p by selection), then one fused pass per sequence
  (:func:`specsample.kernels.cpu.logits.chain_logits`).
* A keyed Gumbel-max step (``method="gumbel"``) on flattened logits: one pass per sequence
  that stops at its first rejected draft (:mod:`specsample.kernels.cpu.gumbel`).
* Every other slot (the block rule, typical acceptance, trees, log-probabilities) runs the
  PyTorch code of :mod:`specsample.backends.eager` until kernels exist for it.

It gives the tokens of the PyTorch backend on the same uniforms: up to a uniform falling
within about ``1e-16`` of a cell boundary on probabilities (see
:mod:`specsample.rules.residual`), and within about ``1e-7`` on logits (whose exponentials
round as float32's do, not bit for bit as PyTorch's, see :mod:`specsample.kernels.cpu.logits`).

The kernels run on CPU tensors (float32 or float64 probabilities, float32 logits) once
compiled: the first call that can use them compiles them in the foreground, announced, or
loads them from the user's cache (:func:`specsample.kernels.cpu.compiler.ready`, which is also where
numba is first imported: ``import specsample`` does not load it). Other calls (half
precision, another device, a call being recorded by ``torch.compile`` or ``make_fx``) run
the PyTorch code, which gives the same tokens (:func:`specsample.kernels.cpu.compiler.runs_on`).
Small
batches run on the calling thread; large ones share PyTorch's thread count
(:func:`specsample.kernels.cpu.compiler.threads`; for a sampled step, as soon as its rows are large:
the threads then share even one sequence's walk).
"""

from __future__ import annotations

import math

import numpy as np
import torch

from specsample.backends import eager
from specsample.kernels.cpu import compiler
from specsample.params.metadata import SamplingMetadata
from specsample.plan import LogitsStep
from specsample.probs import RowStats
from specsample.random import hash_chain, hash_uniform_op
from specsample.rules.chain import (
    ChainStep,
    PaddedRule,
    VerifyResult,
    chain_verify,
    check_rule_inputs,
)

_MARKERS = {torch.float32: np.float32(0), torch.float64: np.float64(0)}
"""The probability dtypes the kernels take, each with a scalar of its type, which types the
rows' memory in a kernel (:mod:`specsample.kernels.cpu.memory`)."""
_PARALLEL_ELEMENTS = 1 << 17
"""Below this many elements of work (``batch * vocab`` for a rule, ``rows * vocab`` for row
statistics), a kernel runs on the calling thread: waking the other threads would cost more
than they save."""


def _parallel(elements: int) -> bool:
    """Whether work of ``elements`` elements goes to a parallel kernel: enough of it
    (:data:`_PARALLEL_ELEMENTS`) and more than one thread allowed
    (:func:`specsample.kernels.cpu.compiler.threads`)."""
    return elements >= _PARALLEL_ELEMENTS and compiler.threads() > 1


def _fused(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> bool:
    """Whether the kernel takes these rows now (else the PyTorch rule runs)."""
    return (
        target_probs.dtype in _MARKERS
        and draft_probs.dtype == target_probs.dtype
        and target_probs.shape[1] > 0
        and target_probs.shape[0] > 0
        and compiler.runs_on(target_probs)
    )


class FusedChainRule(PaddedRule):
    """:data:`specsample.rules.chain.chain_verify` by the fused kernel: same arguments (as
    :meth:`PaddedRule.__call__ <specsample.rules.chain.PaddedRule.__call__>` documents), same
    checks, same result on the same uniforms.

    Examples
    --------
    >>> import torch
    >>> q = torch.tensor([[[0.0, 1.0], [0.5, 0.5]]])
    >>> u = torch.tensor([[0.3, 0.9, 0.5]], dtype=torch.float64)
    >>> fused_chain(q, q, torch.tensor([[1, 0]]), torch.tensor([1]), u).num_accepted
    tensor([2])
    """

    def verify(self, step: ChainStep) -> VerifyResult:
        """The chain rule's result on ``step``, by the kernel when it takes the rows."""
        check_rule_inputs(*step)
        return self.run(step)

    def run(self, step: ChainStep) -> VerifyResult:
        """The chain rule's result on ``step``, its arguments already checked."""
        target, draft, ids, bonus, uniforms = step
        if not _fused(target, draft):
            return chain_verify.run(step)
        from specsample.kernels.cpu import chain  # loaded with numba, at the warm-up

        batch, k, vocab = target.shape
        parallel = batch > 1 and _parallel(batch * vocab)
        chain_rule = chain.chain_rule if parallel else chain.chain_rule_serial
        target, draft, ids, bonus = _rows(target), _rows(draft), _int64(ids), _int64(bonus)
        token_ids = torch.empty((batch, k + 1), dtype=torch.int64)
        num_accepted = torch.empty(batch, dtype=torch.int64)
        chain_rule(
            memory(target),
            memory(draft),
            memory(ids),
            (bonus.data_ptr(), bonus.stride(0)),
            memory(uniforms),
            (token_ids.data_ptr(), num_accepted.data_ptr()),
            (batch, k, vocab),
            _MARKERS[target.dtype],
        )
        return VerifyResult(token_ids, num_accepted)


fused_chain = FusedChainRule()
"""The chain rule on probabilities by the fused CPU kernel (:class:`FusedChainRule`)."""


_NO_FILTER = (torch.empty(0, dtype=torch.int64), torch.empty(2, 0, dtype=torch.float32))
"""The filters of a batch without any, as :func:`_filters` gives them."""

_NO_ROWS = np.zeros(0, np.bool_)
"""No row (an empty ``[rows]`` mask, as the kernels take one)."""

_UNSET = torch.tensor([[math.nan], [math.nan], [-math.inf], [math.nan]], dtype=torch.float32)
"""The shift, (placeholder) inverse temperature, cutoff and log-norm a row starts with before
:func:`specsample.kernels.cpu.logits.row_stats` writes it; a row left to the walk keeps them,
unread (:attr:`specsample.probs.RowStats.lazy` marks it)."""


def _filters(sampling: SamplingMetadata) -> tuple[torch.Tensor, torch.Tensor]:
    """The filters as :func:`specsample.kernels.cpu.logits.row_stats` takes them: ``[rows]``
    int64 top-k (0 off) and ``[2, rows]`` float32 top-p (1 off) and ``log(min_p)`` (``-inf``
    off, computed as :func:`specsample.probs.row_stats` computes it); both empty when no
    request has a filter."""
    top_k, top_p, min_p = sampling.top_k, sampling.top_p, sampling.min_p
    if sampling.max_top_k == 0:
        top_k = None
    if top_k is None and top_p is None and min_p is None:
        return _NO_FILTER
    rows = sampling.inv_temperature.shape[0]
    limits = torch.empty(2, rows, dtype=torch.float32)
    limits[0] = 1.0 if top_p is None else top_p
    limits[1] = (
        -math.inf if min_p is None else torch.where(min_p > 0.0, torch.log(min_p), -math.inf)
    )
    return (torch.zeros(rows, dtype=torch.int64) if top_k is None else _int64(top_k)), limits


def row_stats(
    logits: torch.Tensor, sampling: SamplingMetadata, *, need_norm: bool = False
) -> RowStats:
    """The statistics of ``[rows, vocab]`` logits (:func:`specsample.backends.eager.row_stats`).

    For float32 rows, by the kernel, each row read once from memory: with ``need_norm``, the
    log-norms of every row; without, the sampled rows without a filter are left to the step
    (:attr:`~specsample.probs.RowStats.lazy`), which computes the statistics of the rows
    its walk reads, and the log-norms of greedy rows are not computed. Rows with a
    top-k, top-p or min-p filter get PyTorch's thresholds by selection
    (:mod:`specsample.kernels.cpu.filters`); a row whose top-p threshold is too close to call
    takes its statistics from PyTorch. Which computes a row depends on that row alone, so a
    request's result does not depend on the others in its batch. An all-greedy batch
    without ``need_norm`` needs the argmaxes alone: no filter is applied.
    """
    if not _fused_logits(logits):
        return eager.row_stats(logits, sampling, need_norm=need_norm)
    rows = logits.shape[0]
    filters = _filters(sampling) if need_norm or not sampling.all_greedy else _NO_FILTER
    if not (need_norm or sampling.any_greedy) and filters is _NO_FILTER:  # all left to the walk
        every = torch.ones(rows, dtype=torch.bool)
        return _unset(rows, sampling.inv_temperature)[0]._replace(lazy=every)
    lazy = _NO_ROWS if need_norm or sampling.all_greedy else ~sampling.greedy.numpy()
    stats, undecided = _kernel_stats(logits, sampling.inv_temperature, filters, need_norm, lazy)
    if lazy.any():
        stats = stats._replace(lazy=torch.from_numpy(lazy))
    if undecided.any():
        close = torch.from_numpy(np.flatnonzero(undecided))
        processed = eager.row_stats(logits[close], sampling.rows(close), need_norm=True)
        stats.cutoff[close] = processed.cutoff
        stats.log_norm[close] = processed.log_norm
    return stats


def _kernel_stats(
    logits: torch.Tensor,
    inv_temperature: torch.Tensor,
    filters: tuple[torch.Tensor, torch.Tensor],
    norms: bool,
    lazy: np.ndarray,
) -> tuple[RowStats, np.ndarray]:
    """The statistics of float32 rows by the kernel (``lazy`` as
    :func:`specsample.kernels.cpu.logits.row_stats` takes and leaves it), and the rows it left
    undecided."""
    from specsample.kernels.cpu import logits as kernels

    rows = logits.shape[0]
    read = rows - int(lazy.sum()) if filters[0].shape[0] == 0 else rows
    result, stats = _unset(rows, inv_temperature)
    undecided = np.zeros(rows, np.bool_)
    if read:  # else every row is left to the walk: nothing for the kernel to write
        kernel = (
            kernels.row_stats if _parallel(read * logits.shape[1]) else kernels.row_stats_serial
        )
        top_k, limits = filters
        kernel(
            _dense(_float32(logits)), stats.numpy(), result.argmax.numpy(), norms, _dense(top_k),
            _dense(limits), lazy, undecided,
        )  # fmt: skip
    return result, undecided


def _unset(rows: int, inv_temperature: torch.Tensor) -> tuple[RowStats, torch.Tensor]:
    """The statistics of ``rows`` rows none of which is read yet (:data:`_UNSET`, argmax 0),
    and the ``[4, rows]`` tensor that holds all but their argmaxes."""
    stats = _UNSET.expand(4, rows).clone()
    stats[1] = inv_temperature
    return RowStats(
        stats[1], stats[2], stats[3], torch.zeros(rows, dtype=torch.int64), stats[0]
    ), stats


_HALF = (torch.float16, torch.bfloat16)


def _fused_logits(logits: torch.Tensor) -> bool:
    """Whether the logits kernels take these rows now (float32, or half precision, which
    :func:`_float32` widens exactly)."""
    return (
        (logits.dtype == torch.float32 or logits.dtype in _HALF)
        and logits.shape[0] > 0
        and compiler.runs_on(logits)
    )


def _float32(logits: torch.Tensor) -> torch.Tensor:
    """Half-precision logits widened to float32 (exactly: the same values), for the kernels;
    float32 logits as they are. Half logits thus give what their float32 values give."""
    return logits.float() if logits.dtype in _HALF else logits


def _stacked(stats: RowStats) -> torch.Tensor:
    """``[4, rows]`` float32: shift, inverse temperature, cutoff and log-norm."""
    return torch.stack([stats.shift, stats.inv_temperature, stats.cutoff, stats.log_norm])


def _draft_rows(step: LogitsStep) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The draft rows as the kernel takes them (``[0, 0]`` for one-hot drafts, or when every
    request is greedy) and ``[4, rows]`` room for their statistics, which the kernel computes
    where it reads a row (its inverse temperatures 1; ``[4, 0]`` for probabilities); ``None``
    where it cannot."""
    none = torch.empty(4, 0, dtype=torch.float32)
    if step.plan.uniforms is None:
        return torch.empty(0, 0, dtype=torch.float32), none
    if step.draft_logits is not None and step.draft_logits.shape[0]:
        rows = step.draft_logits
        if not _fused_logits(rows):
            return None
        return _float32(rows), torch.ones(4, rows.shape[0], dtype=torch.float32)
    if step.draft_probs is not None and step.draft_probs.shape[0]:
        rows = step.draft_probs
        return (rows, none) if rows.dtype in _MARKERS else None
    return torch.empty(0, 0, dtype=torch.float32), none


def verify_logits(step: LogitsStep) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`specsample.backends.eager.verify_logits`, by the kernel for a chain step on
    float32 CPU rows (the PyTorch code otherwise): the same tokens on the same uniforms."""
    uniforms = step.plan.uniforms
    fused = step.method == "chain" and _fused_logits(step.target_logits)
    draft = _draft_rows(step) if fused else None
    if draft is None:
        return eager.verify_logits(_completed(step))
    from specsample.kernels.cpu import logits as kernels

    batch = step.plan.layout.batch
    # threads share the walks of sampled sequences (greedy ones read one argmax a row)
    parallel = uniforms is not None and _parallel(step.target_logits.numel())
    kernel = kernels.chain_logits if parallel else kernels.chain_logits_serial
    arrays, token_ids, num_accepted = _step_arrays(step)
    if uniforms is None:
        uniforms = torch.empty(batch, 0, dtype=torch.float64)
    kernel(
        arrays,
        _dense(draft[0]),
        _dense(draft[1]),
        _dense(uniforms),
        token_ids.numpy(),
        num_accepted.numpy(),
        compiler.threads() if parallel else 1,
    )
    return token_ids, num_accepted


def verify_gumbel(step: LogitsStep) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`specsample.backends.eager.verify_gumbel`, by the kernel on float32 (or half)
    CPU rows (:func:`specsample.kernels.cpu.gumbel.gumbel_logits`, which reads a request's rows
    up to its first mismatch alone), the PyTorch code otherwise: the same tokens.

    Parameters
    ----------
    step : LogitsStep
        ``[rows, vocab]`` target logits, ``[total_drafts]`` drafts and the plan (its row keys
        ``[rows]`` int64, ``None`` when every request is greedy).

    Returns
    -------
    tuple of torch.Tensor
        ``[batch, max_drafts + 1]`` int64 tokens (-1 padded) and ``[batch]`` int64 accepted
        counts.
    """
    if not _fused_logits(step.target_logits):
        return eager.verify_gumbel(step)
    from specsample.kernels.cpu import gumbel as kernels

    keys, batch = step.plan.keys, step.plan.layout.batch
    parallel = keys is not None and batch > 1 and _parallel(step.target_logits.numel())
    kernel = kernels.gumbel_logits if parallel else kernels.gumbel_logits_serial
    arrays, token_ids, num_accepted = _step_arrays(step)
    kernel(
        arrays,
        _dense(torch.empty(0, dtype=torch.int64) if keys is None else _int64(keys)),
        token_ids.numpy(),
        num_accepted.numpy(),
        compiler.threads() if parallel else 1,
    )
    return token_ids, num_accepted


def _step_arrays(
    step: LogitsStep,
) -> tuple[tuple[np.ndarray, ...], torch.Tensor, torch.Tensor]:
    """The arrays every logits kernel takes first: the float32 target rows, their ``[4, rows]``
    statistics, ``[rows]`` argmaxes and rows left to the walk (empty for none), the layout as
    ``[5, batch]`` int64 (drafts, first draft row, first target row, greedy, the given bonus
    token or -1) and the drafts; then
    the outputs, ``[batch, max_drafts + 1]`` tokens filled with -1 and ``[batch]`` accepted
    counts."""
    plan, bonus = step.plan, step.bonus_token_ids
    layout, stats, batch = plan.layout, plan.stats, plan.layout.batch
    columns = [layout.num_drafts, layout.draft_start, layout.target_start, plan.greedy]
    columns.append(torch.full((batch,), -1, dtype=torch.int64) if bonus is None else bonus)
    arrays = (
        _dense(_float32(step.target_logits)),
        _dense(_stacked(stats)),
        _dense(stats.argmax),
        _NO_ROWS if stats.lazy is None else stats.lazy.numpy(),
        _dense(torch.stack([_int64(c) for c in columns])),
        _dense(_int64(step.draft_token_ids)),
    )
    token_ids = torch.full((batch, layout.max_drafts + 1), -1, dtype=torch.int64)
    return arrays, token_ids, torch.empty(batch, dtype=torch.int64)


def _completed(step: LogitsStep) -> LogitsStep:
    """``step`` with the statistics :func:`row_stats` left to the step (the rows
    :attr:`~specsample.probs.RowStats.lazy` marks) and the log-norms it did not compute
    filled in: what the PyTorch code reads."""
    if step.plan.uniforms is None or not _fused_logits(step.target_logits):
        return step
    from specsample.kernels.cpu.logits import fill_norms

    stats = step.plan.stats
    stacked, argmax = _stacked(stats), stats.argmax.clone()
    lazy = _NO_ROWS if stats.lazy is None else stats.lazy.numpy()
    fill_norms(_dense(_float32(step.target_logits)), stacked.numpy(), argmax.numpy(), lazy)
    full = RowStats(stats.inv_temperature, stacked[2], stacked[3], argmax, stacked[0])
    return step._replace(plan=step.plan._replace(stats=full))


@hash_uniform_op.register_kernel("cpu")
def _hash_uniform(key: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """The counter hash of :mod:`specsample.random` on CPU tensors: one compiled loop
    (:mod:`specsample.kernels.cpu.hashing`, the same numbers bit for bit in a fifth of the
    time, compiled on first use), or the integer tensor chain where the kernels cannot run
    (numba missing)."""
    if not compiler.ready():
        return hash_chain(key, counters)
    from specsample.kernels.cpu.hashing import hash_uniform  # loaded with numba

    out = torch.empty(counters.shape, dtype=torch.float64)
    hash_uniform(key.contiguous().numpy(), counters.contiguous().numpy(), out.numpy())
    return out


def memory(tensor: torch.Tensor) -> tuple[int, ...]:
    """``(address, *strides)`` of a CPU tensor, strides in elements: the tensor as the
    kernels of :mod:`specsample.kernels.cpu.chain` take it (:mod:`specsample.kernels.cpu.memory`).

    Examples
    --------
    >>> x = torch.zeros(2, 3)
    >>> memory(x.t()) == (x.data_ptr(), 1, 3)
    True
    """
    return (tensor.data_ptr(), *tensor.stride())


def _rows(probs: torch.Tensor) -> torch.Tensor:
    """``probs`` itself when its rows are contiguous (as the kernel reads them), else a
    contiguous copy."""
    return probs if probs.stride(-1) == 1 else probs.contiguous()


def _int64(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` as int64 (itself when it already is: no operation on the hot path)."""
    return tensor if tensor.dtype == torch.int64 else tensor.to(torch.int64)


def _dense(tensor: torch.Tensor) -> np.ndarray:
    """The NumPy view of a CPU tensor, copied first unless contiguous (the logits kernels
    are compiled for contiguous arrays alone)."""
    dense = tensor if tensor.is_contiguous() else tensor.contiguous()
    return (dense.detach() if dense.requires_grad else dense).numpy()


def prob_rule(method: str) -> PaddedRule:
    """The fused chain rule; the PyTorch rule for the other methods."""
    return fused_chain if method == "chain" else eager.prob_rule(method)
