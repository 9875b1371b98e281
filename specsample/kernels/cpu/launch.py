"""Host side of the CPU kernels: which calls they take, tensors as the kernels read them,
thread counts, and the calls themselves.

Nothing here decides what runs when a kernel cannot: :mod:`specsample.backends.cpu` asks
whether the kernels take a step (:func:`takes_probs`, :func:`takes_logits`) and runs the
PyTorch code otherwise. The kernels are imported inside the calls (with numba, at the
warm-up of :mod:`specsample.kernels.cpu.compiler`), so importing this module loads neither.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from specsample.kernels.cpu import compiler
from specsample.params.metadata import SamplingMetadata
from specsample.plan import LogitsStep
from specsample.probs import RowNorms
from specsample.rules.chain import ChainStep, VerifyResult

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


def takes_probs(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> bool:
    """Whether the kernel takes these rows now (else the PyTorch rule runs)."""
    return (
        target_probs.dtype in _MARKERS
        and draft_probs.dtype == target_probs.dtype
        and target_probs.shape[1] > 0
        and target_probs.shape[0] > 0
        and compiler.runs_on(target_probs)
    )


def chain_probs(step: ChainStep) -> VerifyResult:
    """The chain rule on ``[batch, k, vocab]`` probabilities the kernel takes
    (:func:`takes_probs`), by :func:`specsample.kernels.cpu.chain.chain_rule`: ``[batch, k + 1]``
    int64 tokens and ``[batch]`` int64 accepted counts."""
    from specsample.kernels.cpu import chain  # loaded with numba, at the warm-up

    target, draft, ids, bonus, uniforms = step
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


_NO_FILTER = (torch.empty(0, dtype=torch.int64), torch.empty(2, 0, dtype=torch.float32))
"""The filters of a batch without any, as :func:`_filters` gives them."""

_NO_ROWS = np.zeros(0, np.bool_)
"""No row (an empty ``[rows]`` mask, as the kernels take one)."""

_UNSET = torch.tensor([[math.nan], [math.nan], [-math.inf], [math.nan]], dtype=torch.float32)
"""The shift, (placeholder) inverse temperature, cutoff and log-norm a row starts with before
:func:`specsample.kernels.cpu.logits.row_norms` writes it; a row left to the walk keeps them,
unread (:attr:`specsample.probs.RowNorms.lazy` marks it)."""


def _filters(sampling: SamplingMetadata) -> tuple[torch.Tensor, torch.Tensor]:
    """The filters as :func:`specsample.kernels.cpu.logits.row_norms` takes them: ``[rows]``
    int64 top-k (0 off) and ``[2, rows]`` float32 top-p (1 off) and ``log(min_p)`` (``-inf``
    off, computed as :func:`specsample.probs.row_norms` computes it); both empty when no
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


def row_norms(
    logits: torch.Tensor, sampling: SamplingMetadata, need_norm: bool
) -> tuple[RowNorms, np.ndarray]:
    """The norms of ``[rows, vocab]`` logits the kernels take (:func:`takes_logits`), as
    :func:`specsample.backends.cpu.row_norms` describes them, and ``[rows]`` bool the rows
    whose top-p threshold was too close to call (their cutoff and log-norm to be taken from
    PyTorch)."""
    rows = logits.shape[0]
    filters = _filters(sampling) if need_norm or not sampling.all_greedy else _NO_FILTER
    if not (need_norm or sampling.any_greedy) and filters is _NO_FILTER:  # all left to the walk
        every = torch.ones(rows, dtype=torch.bool)
        return _unset(rows, sampling.inv_temperature)[0]._replace(lazy=every), _NO_ROWS
    lazy = _NO_ROWS if need_norm or sampling.all_greedy else ~sampling.greedy.numpy()
    norms, undecided = _kernel_norms(logits, sampling.inv_temperature, filters, need_norm, lazy)
    if lazy.any():
        norms = norms._replace(lazy=torch.from_numpy(lazy))
    return norms, undecided


def _kernel_norms(
    logits: torch.Tensor,
    inv_temperature: torch.Tensor,
    filters: tuple[torch.Tensor, torch.Tensor],
    with_norm: bool,
    lazy: np.ndarray,
) -> tuple[RowNorms, np.ndarray]:
    """The statistics of float32 rows by the kernel (``lazy`` as
    :func:`specsample.kernels.cpu.logits.row_norms` takes and leaves it), and the rows it left
    undecided."""
    from specsample.kernels.cpu import logits as kernels

    rows = logits.shape[0]
    read = rows - int(lazy.sum()) if filters[0].shape[0] == 0 else rows
    result, stacked = _unset(rows, inv_temperature)
    undecided = np.zeros(rows, np.bool_)
    if read:  # else every row is left to the walk: nothing for the kernel to write
        kernel = (
            kernels.row_norms if _parallel(read * logits.shape[1]) else kernels.row_norms_serial
        )
        top_k, limits = filters
        kernel(
            _dense(_float32(logits)), stacked.numpy(), result.argmax.numpy(), with_norm,
            _dense(top_k),
            _dense(limits), lazy, undecided,
        )  # fmt: skip
    return result, undecided


def _unset(rows: int, inv_temperature: torch.Tensor) -> tuple[RowNorms, torch.Tensor]:
    """The statistics of ``rows`` rows none of which is read yet (:data:`_UNSET`, argmax 0),
    and the ``[4, rows]`` tensor that holds all but their argmaxes."""
    norms = _UNSET.expand(4, rows).clone()
    norms[1] = inv_temperature
    return RowNorms(
        norms[1], norms[2], norms[3], torch.zeros(rows, dtype=torch.int64), norms[0]
    ), norms


_HALF = (torch.float16, torch.bfloat16)


def takes_logits(logits: torch.Tensor) -> bool:
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


def _stacked(norms: RowNorms) -> torch.Tensor:
    """``[4, rows]`` float32: shift, inverse temperature, cutoff and log-norm."""
    return torch.stack([norms.shift, norms.inv_temperature, norms.cutoff, norms.log_norm])


def draft_rows(step: LogitsStep) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The draft rows as the kernel takes them (``[0, 0]`` for one-hot drafts, or when every
    request is greedy) and ``[4, rows]`` room for their statistics, which the kernel computes
    where it reads a row (its inverse temperatures 1; ``[4, 0]`` for probabilities); ``None``
    where it cannot."""
    none = torch.empty(4, 0, dtype=torch.float32)
    if step.plan.uniforms is None:
        return torch.empty(0, 0, dtype=torch.float32), none
    if step.draft_logits is not None and step.draft_logits.shape[0]:
        rows = step.draft_logits
        if not takes_logits(rows):
            return None
        return _float32(rows), torch.ones(4, rows.shape[0], dtype=torch.float32)
    if step.draft_probs is not None and step.draft_probs.shape[0]:
        rows = step.draft_probs
        return (rows, none) if rows.dtype in _MARKERS else None
    return torch.empty(0, 0, dtype=torch.float32), none


def chain_logits(
    step: LogitsStep, draft: tuple[torch.Tensor, torch.Tensor]
) -> tuple[torch.Tensor, torch.Tensor]:
    """A chain step on flattened logits by :func:`specsample.kernels.cpu.logits.chain_logits`,
    with the draft rows of :func:`draft_rows`: ``[batch, max_drafts + 1]`` int64 tokens and
    ``[batch]`` int64 accepted counts."""
    from specsample.kernels.cpu import logits as kernels

    uniforms, batch = step.plan.uniforms, step.plan.layout.batch
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


def gumbel_logits(step: LogitsStep) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``method="gumbel"`` step on flattened logits by
    :func:`specsample.kernels.cpu.gumbel.gumbel_logits`: ``[batch, max_drafts + 1]`` int64
    tokens (-1 padded) and ``[batch]`` int64 accepted counts."""
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
    layout, norms, batch = plan.layout, plan.norms, plan.layout.batch
    columns = [layout.num_drafts, layout.draft_start, layout.target_start, plan.greedy]
    columns.append(torch.full((batch,), -1, dtype=torch.int64) if bonus is None else bonus)
    arrays = (
        _dense(_float32(step.target_logits)),
        _dense(_stacked(norms)),
        _dense(norms.argmax),
        _NO_ROWS if norms.lazy is None else norms.lazy.numpy(),
        _dense(torch.stack([_int64(c) for c in columns])),
        _dense(_int64(step.draft_token_ids)),
    )
    token_ids = torch.full((batch, layout.max_drafts + 1), -1, dtype=torch.int64)
    return arrays, token_ids, torch.empty(batch, dtype=torch.int64)


def completed(step: LogitsStep) -> LogitsStep:
    """``step`` with the statistics :func:`row_norms` left to the step (the rows
    :attr:`~specsample.probs.RowNorms.lazy` marks) and the log-norms it did not compute
    filled in: what the PyTorch code reads."""
    if step.plan.uniforms is None or not takes_logits(step.target_logits):
        return step
    from specsample.kernels.cpu.logits import fill_norms

    norms = step.plan.norms
    stacked, argmax = _stacked(norms), norms.argmax.clone()
    lazy = _NO_ROWS if norms.lazy is None else norms.lazy.numpy()
    fill_norms(_dense(_float32(step.target_logits)), stacked.numpy(), argmax.numpy(), lazy)
    full = RowNorms(norms.inv_temperature, stacked[2], stacked[3], argmax, stacked[0])
    return step._replace(plan=step.plan._replace(norms=full))


def hash_uniform(key: torch.Tensor, counters: torch.Tensor) -> torch.Tensor:
    """The counter hash of :mod:`specsample.random` on CPU tensors by the compiled loop of
    :mod:`specsample.kernels.cpu.hashing` (the kernels ready): ``counters``' shape, float64."""
    from specsample.kernels.cpu.hashing import hash_uniform as kernel  # loaded with numba

    out = torch.empty(counters.shape, dtype=torch.float64)
    kernel(key.contiguous().numpy(), counters.contiguous().numpy(), out.numpy())
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
