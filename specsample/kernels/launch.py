"""Host side of the Triton verifiers: argument checks, launch configuration, entry points.

Nothing here reads a device tensor: shapes, dtypes and host-side counts decide every launch
parameter, so a step runs without synchronising with the device. The kernels themselves
live in :mod:`specsample.kernels._jit`, which is loaded on first use, compiled for the GPU or,
when ``TRITON_INTERPRET=1`` is set, run by Triton's interpreter on CPU tensors (slow; for
tests).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from functools import lru_cache
from pathlib import Path
from types import ModuleType
from typing import Any, NamedTuple

import torch

from specsample.metadata import BatchLayout
from specsample.probs import RowStats, row_stats
from specsample.rules.chain import VerifyResult
from specsample.rules.residual import BLOCK
from specsample.rules.rows import flat_rows

__all__ = [
    "block_kernel_verify",
    "chain_kernel_verify",
    "interpreting",
    "supports",
    "triton_available",
    "verify_logits",
]

_TRUE = ("1", "true", "on", "yes")
_MODULES: dict[bool, ModuleType] = {}
_PROGRAMS_PER_SM = 4
_INTERPRETER_ELEMENTS = 1 << 15
_INTERPRETER_ROWS = 1024

FUSE_MAX_BLOCKS = 1
"""Vocabularies of at most this many blocks of 1024 columns use one kernel instead of two."""


@lru_cache(maxsize=1)
def triton_available() -> bool:
    """Whether :mod:`triton` can be imported (checked without importing it)."""
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for Triton's interpreter (kernels on CPU tensors)."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


def supports(tensor: torch.Tensor) -> bool:
    """Whether the kernels can run on ``tensor``'s device in this process.

    True for CUDA tensors when triton is installed, and for any tensor when the interpreter
    is enabled (``TRITON_INTERPRET=1``).
    """
    if not triton_available():
        return False
    return interpreting() or tensor.device.type == "cuda"


def _programs() -> ModuleType:
    """The kernel module for the current mode (compiled or interpreted), loaded once per mode.

    Triton decides at decoration time whether a function is compiled or interpreted, so each
    mode gets its own copy of :mod:`specsample.kernels._jit`, executed under that mode.
    """
    interpret = interpreting()
    module = _MODULES.get(interpret)
    if module is not None:
        return module
    if not triton_available():
        raise RuntimeError("the Triton kernels need triton: pip install 'specsample[triton]'")
    name = f"{__package__}._jit_{'interpreted' if interpret else 'compiled'}"
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name("_jit.py"))
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the kernels from {Path(__file__).with_name('_jit.py')}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    _MODULES[interpret] = module
    return module


def _next_power_of_two(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


@lru_cache(maxsize=8)
def _sm_count(index: int) -> int:
    return int(torch.cuda.get_device_properties(index).multi_processor_count)


class _Config(NamedTuple):
    """Launch parameters of one call (all decided on the host from shapes)."""

    rows: int
    cols: int
    blocks_per_iter: int
    nb_pad: int
    n_blocks: int
    splits: int
    iters_per_split: int
    k1: int
    fused: bool
    warps: int


def _config(device: torch.device, batch: int, vocab: int, k: int, positions: int) -> _Config:
    n_blocks = -(-vocab // BLOCK)
    cols = BLOCK if vocab >= BLOCK else _next_power_of_two(vocab)
    k1 = _next_power_of_two(k + 1)
    nb_pad = _next_power_of_two(n_blocks)
    fused = n_blocks <= FUSE_MAX_BLOCKS
    if interpreting() or device.type != "cuda":
        width = max(cols, k1 * nb_pad, k1 * cols if fused else 1)
        rows = max(1, min(_INTERPRETER_ROWS, _INTERPRETER_ELEMENTS // width))
        rows = min(_next_power_of_two(batch), 1 << (rows.bit_length() - 1))
        per_iter = 1 if n_blocks < 2 else 2
        n_iters = -(-n_blocks // per_iter)
        return _Config(rows, cols, per_iter, nb_pad, n_blocks, 1, n_iters, k1, fused, 4)
    per_iter = min(4, _next_power_of_two(n_blocks)) if n_blocks > 1 else 1
    n_iters = -(-n_blocks // per_iter)
    index = device.index if device.index is not None else torch.cuda.current_device()
    target = _PROGRAMS_PER_SM * _sm_count(index)
    splits = max(1, min(n_iters, -(-target // max(batch * positions, 1))))
    per_split = -(-n_iters // splits)
    splits = -(-n_iters // per_split)
    return _Config(1, cols, per_iter, nb_pad, n_blocks, splits, per_split, k1, fused, 4)


def _nonempty(tensor: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """``tensor``, or an unread one-element stand-in when it is absent or empty."""
    if tensor is None or tensor.numel() == 0:
        return torch.empty(1, dtype=like.dtype, device=like.device)
    return tensor


def _unit_columns(rows: torch.Tensor) -> torch.Tensor:
    """``rows [n, vocab]`` with unit column stride (copied only when needed)."""
    return rows if rows.stride(-1) == 1 or rows.shape[-1] <= 1 else rows.contiguous()


def _launch(
    *,
    target: torch.Tensor,
    target_stats: RowStats | None,
    draft: torch.Tensor | None,
    draft_stats: RowStats | None,
    ids: torch.Tensor,
    uniforms: torch.Tensor | None,
    layout: BatchLayout | None,
    greedy: torch.Tensor | None,
    bonus: torch.Tensor | None,
    batch: int,
    vocab: int,
    k: int,
    steps: tuple[int, int],
    rule: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the kernels; returns ``token_ids [batch, k + 1]`` and ``num_accepted [batch]``."""
    device = target.device
    token_ids = torch.empty(batch, k + 1, dtype=torch.int64, device=device)
    num_accepted = torch.empty(batch, dtype=torch.int64, device=device)
    if batch == 0:
        return token_ids, num_accepted
    positions = 1 if rule == 0 else (k if layout is None else k + 1)
    config = _config(device, batch, vocab, k, positions)
    draft_mode = 0 if draft is None else (2 if draft_stats is not None else 1)
    sampled = uniforms is not None
    raw_mass = (
        rule == 0
        and target_stats is None
        and draft is not None
        and target.dtype != torch.float32
        and draft.dtype == target.dtype
    )
    floats = torch.empty(1, dtype=torch.float32, device=device)
    longs = torch.empty(1, dtype=torch.int64, device=device)
    stats = target_stats if target_stats is not None else RowStats(floats, floats, floats, longs)
    d_stats = draft_stats if draft_stats is not None else RowStats(floats, floats, floats, longs)
    dense = _nonempty(draft, target)
    masses = floats
    if sampled and not config.fused:
        size = batch * positions * 2 * config.n_blocks
        masses = torch.empty(size, dtype=torch.float32, device=device)
    args: list[Any] = [
        target,
        target.stride(0),
        stats.inv_temperature,
        stats.cutoff,
        stats.log_norm,
        stats.argmax,
        dense,
        dense.stride(0) if dense.dim() == 2 else 0,
        d_stats.cutoff,
        d_stats.log_norm,
        _nonempty(ids, longs),
        uniforms if uniforms is not None else torch.empty(1, 1, dtype=torch.float64, device=device),
        k + 1,
        layout.target_start if layout is not None else longs,
        layout.draft_start if layout is not None else longs,
        layout.num_drafts_t if layout is not None else longs,
        greedy.view(torch.uint8) if greedy is not None else longs,
        bonus if bonus is not None else longs,
        masses,
        token_ids,
        num_accepted,
        batch,
        vocab,
        k,
        steps[0],
        steps[1],
        config.n_blocks,
        positions,
        config.iters_per_split,
    ]
    constants: dict[str, Any] = {
        "R": config.rows,
        "K1": config.k1,
        "COLS": config.cols,
        "BPI": config.blocks_per_iter,
        "NB_PAD": config.nb_pad,
        "TARGET_LOGITS": target_stats is not None,
        "DRAFT": draft_mode,
        "RULE": rule,
        "RAGGED": layout is not None,
        "BONUS_IDS": bonus is not None,
        "HAS_GREEDY": greedy is not None,
        "SAMPLED": sampled,
        "RAW_MASS": raw_mass,
        "FUSED": config.fused,
        "num_warps": config.warps,
        "enable_fp_fusion": False,
        "enable_reflect_ftz": False,
    }
    programs = _programs()
    tiles = -(-batch // config.rows)
    if sampled and not config.fused:
        grid = (tiles, positions, config.splits)
        programs.masses_kernel[grid](*args, **constants)
    programs.verify_kernel[(tiles,)](*args, **constants)
    return token_ids, num_accepted


def _check_device(*tensors: torch.Tensor | None) -> None:
    device = next(t for t in tensors if t is not None).device
    for t in tensors:
        if t is not None and t.device != device:
            raise ValueError(f"all inputs must be on {device}, got one on {t.device}")
    if not supports(next(t for t in tensors if t is not None)):
        raise RuntimeError(
            "the Triton kernels run on CUDA tensors (or on any tensor with TRITON_INTERPRET=1)"
            + ("" if triton_available() else "; triton is not installed")
        )


def _padded(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    uniforms: torch.Tensor,
    rule: int,
) -> VerifyResult:
    """The padded probability rules (:func:`chain_kernel_verify`, :func:`block_kernel_verify`)."""
    if target_probs.dim() != 3 or draft_probs.shape != target_probs.shape:
        raise ValueError(
            "target_probs and draft_probs must both have shape [batch, k, vocab], got "
            f"{tuple(target_probs.shape)} and {tuple(draft_probs.shape)}"
        )
    batch, k, vocab = target_probs.shape
    if draft_token_ids.shape != (batch, k):
        raise ValueError(f"draft_token_ids must have shape {(batch, k)}")
    if uniforms.shape != (batch, k + 1) or uniforms.dtype != torch.float64:
        raise ValueError(f"uniforms must be float64 of shape {(batch, k + 1)}")
    bonus = bonus_token_ids.reshape(batch)
    _check_device(target_probs, draft_probs, draft_token_ids, bonus, uniforms)
    if k == 0:
        ids = bonus.to(torch.int64)
        return VerifyResult(ids.unsqueeze(-1), torch.zeros_like(ids))
    target_rows, target_step = flat_rows(target_probs)
    draft_rows, draft_step = flat_rows(draft_probs)
    token_ids, num_accepted = _launch(
        target=_unit_columns(target_rows),
        target_stats=None,
        draft=_unit_columns(draft_rows),
        draft_stats=None,
        ids=draft_token_ids.contiguous(),
        uniforms=uniforms.contiguous(),
        layout=None,
        greedy=None,
        bonus=bonus.contiguous(),
        batch=batch,
        vocab=vocab,
        k=k,
        steps=(target_step, draft_step),
        rule=rule,
    )
    return VerifyResult(token_ids, num_accepted)


def chain_kernel_verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    uniforms: torch.Tensor,
) -> VerifyResult:
    """Token-by-token verification in two Triton kernels; same contract as ``chain_verify``.

    Same arguments, result and randomness as :func:`specsample.rules.chain.chain_verify`:
    given the same uniforms it emits the same tokens, up to floating-point ties (a uniform
    within rounding of a boundary of the inverse CDF). The residual is computed only at each
    sequence's first rejected position, and not at all when every draft is accepted.

    Parameters
    ----------
    target_probs, draft_probs : torch.Tensor
        ``[batch, k, vocab]`` (float32, float16, bfloat16 or float64), unit column stride
        preferred (other layouts are copied).
    draft_token_ids : torch.Tensor
        ``[batch, k]`` int64 or int32; ids outside ``[0, vocab)`` are rejected.
    bonus_token_ids : torch.Tensor
        ``[batch]`` or ``[batch, 1]``, emitted when all ``k`` drafts are accepted.
    uniforms : torch.Tensor
        ``[batch, k + 1]`` float64: the accept tests, then the residual draw.

    Returns
    -------
    VerifyResult
        ``token_ids [batch, k + 1]`` int64 and ``num_accepted [batch]`` int64.

    Raises
    ------
    RuntimeError
        Triton is missing, or the tensors are on the CPU without ``TRITON_INTERPRET=1``.
    """
    return _padded(target_probs, draft_probs, draft_token_ids, bonus_token_ids, uniforms, 0)


def block_kernel_verify(
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    bonus_token_ids: torch.Tensor,
    uniforms: torch.Tensor,
) -> VerifyResult:
    """Block verification in two Triton kernels; same contract as ``block_verify``.

    Same arguments, result and randomness as :func:`specsample.rules.block.block_verify`
    (the first ``k`` uniforms are the ``eta_i``, the last draws the residual). The first
    kernel computes the block masses of ``max(w_i q_i - p_i, 0)`` at every position; the
    second the weights, the accepted length and the draw at row ``tau``.

    Parameters
    ----------
    target_probs, draft_probs : torch.Tensor
        ``[batch, k, vocab]``.
    draft_token_ids : torch.Tensor
        ``[batch, k]`` int64 or int32.
    bonus_token_ids : torch.Tensor
        ``[batch]`` or ``[batch, 1]``.
    uniforms : torch.Tensor
        ``[batch, k + 1]`` float64.

    Returns
    -------
    VerifyResult
        ``token_ids [batch, k + 1]`` int64 and ``num_accepted [batch]`` int64.
    """
    return _padded(target_probs, draft_probs, draft_token_ids, bonus_token_ids, uniforms, 1)


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

    Returns
    -------
    tuple of torch.Tensor
        ``token_ids [batch, max_drafts + 1]`` int64 (accepted drafts, one more token, ``-1``)
        and ``num_accepted [batch]`` int64.

    Raises
    ------
    ValueError
        ``method="block"`` with sampled requests, drafts and no draft rows; an unknown method.
    """
    if method not in ("chain", "block"):
        raise ValueError(f"method must be 'chain' or 'block', got {method!r}")
    if draft_probs is not None and draft_logits is not None:
        raise ValueError("pass draft_probs or draft_logits, not both")
    _check_device(target_logits, draft_token_ids, greedy, uniforms, draft_probs, draft_logits)
    vocab = target_logits.shape[-1]
    k = layout.max_drafts
    if uniforms is not None and uniforms.shape != (layout.batch, k + 1):
        raise ValueError(f"uniforms must have shape {(layout.batch, k + 1)}")
    draft = draft_probs if draft_probs is not None else draft_logits
    if draft is not None and draft.shape[0] == 0:
        draft = None
    draft_stats = None
    if draft is not None and draft_logits is not None:
        ones = torch.ones(draft.shape[0], device=draft.device)
        draft_stats = row_stats(draft, ones)
    rule = 1 if method == "block" and layout.total_drafts and uniforms is not None else 0
    if rule == 1 and draft is None:
        raise ValueError(
            "method='block' needs draft_probs or draft_logits: with one-hot drafts it accepts "
            "exactly as many tokens in expectation as method='chain'"
        )
    return _launch(
        target=_unit_columns(target_logits),
        target_stats=stats,
        draft=_unit_columns(draft) if draft is not None else None,
        draft_stats=draft_stats,
        ids=draft_token_ids,
        uniforms=uniforms.contiguous() if uniforms is not None else None,
        layout=layout,
        greedy=greedy,
        bonus=None,
        batch=layout.batch,
        vocab=vocab,
        k=k,
        steps=(0, 0),
        rule=rule,
    )


RULES: dict[str, Callable[..., VerifyResult]] = {
    "chain": chain_kernel_verify,
    "block": block_kernel_verify,
}
"""The padded probability rules by name, as :class:`specsample.RejectionSampler` names them."""
