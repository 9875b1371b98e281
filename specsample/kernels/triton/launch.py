"""Host side of the Triton verifiers: device checks, loading, launch configuration, launches.

Nothing here reads a device tensor: shapes, dtypes and host-side counts decide every launch
parameter, so a step runs without synchronising with the device. The kernel itself lives in
:mod:`specsample.kernels.triton.step_kernel` (with :mod:`specsample.kernels.triton._residual` and
:mod:`specsample.kernels.triton._common`), loaded on first use, compiled for the GPU or, when
``TRITON_INTERPRET=1`` is set, run by Triton's interpreter on CPU tensors (slow; for tests).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import sys
from functools import lru_cache
from pathlib import Path
from typing import Any, NamedTuple

import torch

from specsample.extras import install_command
from specsample.methods import METHODS, chain_methods
from specsample.params.layout import BatchLayout
from specsample.probs import RowNorms
from specsample.rules.residual import BLOCK

_TRUE = ("1", "true", "on", "yes")
_PROGRAMS_PER_SM = 4
_INTERPRETER_ELEMENTS = 1 << 15
_INTERPRETER_ROWS = 1024

FUSE_MAX_BLOCKS = 1
"""Vocabularies of at most this many blocks of 1024 columns use one kernel instead of two."""


@lru_cache(maxsize=1)
def triton_available() -> bool:
    """Whether :mod:`triton` can be imported (checked without importing it).

    Examples
    --------
    >>> isinstance(triton_available(), bool)
    True
    """
    return importlib.util.find_spec("triton") is not None


def interpreting() -> bool:
    """Whether ``TRITON_INTERPRET`` asks for Triton's interpreter (kernels on CPU tensors).

    Examples
    --------
    >>> interpreting() == (os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true"))
    True
    """
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() in _TRUE


def supports(tensor: torch.Tensor) -> bool:
    """Whether the kernels can run on ``tensor``'s device in this process.

    True for CUDA tensors when triton is installed, and for any tensor when the interpreter
    is enabled (``TRITON_INTERPRET=1``).

    Examples
    --------
    >>> supports(torch.zeros(1)) == (triton_available() and interpreting())
    True
    """
    if not triton_available():
        return False
    return interpreting() or tensor.device.type == "cuda"


# The ``PHASE`` values of the kernel (see :mod:`specsample.kernels.triton.step_kernel`).
_MASSES = 0
_VERIFY = 1

MODE_PACKAGES = {False: "_compiled", True: "_interpreted"}
"""The package of each mode's copy of the kernel modules, by ``interpreting()``."""

_LOADED: dict[tuple[bool, str, str], Any] = {}


def mode_kernel(module: str, name: str) -> Any:
    """Kernel ``name`` of the kernel module ``module`` for the current mode (compiled or
    interpreted), loaded once per mode.

    Triton decides at decoration time whether a function is compiled or interpreted, so each
    mode gets its own copy of the kernel modules: they are imported as submodules of a
    package made for the mode, ``specsample.kernels.triton._compiled`` or ``._interpreted``, whose
    path is this folder, and their relative imports stay within that copy.
    """
    interpret = interpreting()
    kernel = _LOADED.get((interpret, module, name))
    if kernel is not None:
        return kernel
    if not triton_available():
        raise RuntimeError(f"the Triton kernels need triton: {install_command('triton')}")
    package = f"{__package__}.{MODE_PACKAGES[interpret]}"
    if package not in sys.modules:
        spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
        spec.submodule_search_locations = [str(Path(__file__).parent)]
        sys.modules[package] = importlib.util.module_from_spec(spec)
    loaded = importlib.import_module(f"{package}.{module}")
    kernel = _LOADED[(interpret, module, name)] = getattr(loaded, name)
    return kernel


def _kernel() -> Any:
    """The chain and block step kernel (:mod:`~specsample.kernels.triton.step_kernel`), for
    the mode."""
    return mode_kernel("step_kernel", "_step_kernel")


KERNEL_METHODS = tuple(m for m in chain_methods() if not METHODS[m].keyed)
"""The methods the kernel runs, in the order of its ``RULE``: 0 the chain rule, 1 block
verification (the exact chain methods of :mod:`specsample.methods` that read uniforms;
``"gumbel"`` has a kernel of its own, :mod:`specsample.kernels.triton.gumbel`)."""


def _rule_id(method: str) -> int:
    """The kernel's ``RULE`` for a method of :data:`KERNEL_METHODS`: its index there."""
    return KERNEL_METHODS.index(method)


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


class _Step(NamedTuple):
    """One step as the kernels take it: device tensors, and host-side sizes and switches.

    ``target`` holds ``[rows, vocab]`` probabilities (``target_norms`` None) or logits;
    ``draft`` dense ``[rows, vocab]`` probabilities, logits (with ``draft_norms``) or None
    (one-hot drafts); ``layout`` the ragged layout, or None for the padded ``[batch, k]``
    rules (row ``b * steps[i] + j`` then holds position ``j`` of sequence ``b``); ``rule`` is
    the kernel's ``RULE`` (:func:`_rule_id`: 0 chain, 1 block).
    """

    target: torch.Tensor
    target_norms: RowNorms | None
    draft: torch.Tensor | None
    draft_norms: RowNorms | None
    ids: torch.Tensor
    uniforms: torch.Tensor | None
    layout: BatchLayout | None
    greedy: torch.Tensor | None
    bonus: torch.Tensor | None
    batch: int
    vocab: int
    k: int
    steps: tuple[int, int]
    rule: int

    @property
    def positions(self) -> int:
        """Rows per request whose block masses the masses phase computes.

        1 for the chain rule (the row its draw reads); for the block rule every draft row,
        and with a ragged layout the bonus row too.
        """
        if self.rule == 0:
            return 1
        return self.k if self.layout is None else self.k + 1


def _nonempty(tensor: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """``tensor``, or an unread one-element stand-in when it is absent or empty."""
    if tensor is None or tensor.numel() == 0:
        return torch.empty(1, dtype=like.dtype, device=like.device)
    return tensor


def _arguments(
    step: _Step,
    config: _Config,
    masses: torch.Tensor,
    token_ids: torch.Tensor,
    num_accepted: torch.Tensor,
) -> list[Any]:
    """The runtime arguments of the kernel, in their order (absent tensors stood in)."""
    device = step.target.device
    floats = torch.empty(1, dtype=torch.float32, device=device)
    longs = torch.empty(1, dtype=torch.int64, device=device)
    unread = RowNorms(floats, floats, floats, longs, floats)
    norms = step.target_norms if step.target_norms is not None else unread
    d_norms = step.draft_norms if step.draft_norms is not None else unread
    dense = _nonempty(step.draft, step.target)
    layout, uniforms = step.layout, step.uniforms
    return [
        step.target,
        step.target.stride(0),
        norms.inv_temperature,
        norms.cutoff,
        norms.log_norm,
        norms.shift,
        norms.argmax,
        dense,
        dense.stride(0) if dense.dim() == 2 else 0,
        d_norms.cutoff,
        d_norms.log_norm,
        d_norms.shift,
        _nonempty(step.ids, longs),
        uniforms if uniforms is not None else torch.empty(1, 1, dtype=torch.float64, device=device),
        step.k + 1,
        layout.target_start if layout is not None else longs,
        layout.draft_start if layout is not None else longs,
        layout.num_drafts if layout is not None else longs,
        step.greedy.view(torch.uint8) if step.greedy is not None else longs,
        step.bonus if step.bonus is not None else longs,
        _nonempty(masses, floats),
        token_ids,
        num_accepted,
        step.batch,
        step.vocab,
        step.k,
        step.steps[0],
        step.steps[1],
        config.n_blocks,
        step.positions,
        config.iters_per_split,
    ]


def _constants(step: _Step, config: _Config) -> dict[str, Any]:
    """The compile-time arguments of both phases, and the compiler options.

    ``WIDE``: float64 target probabilities with dense draft probabilities, whose block
    masses the rule computes in float64 (see :mod:`specsample.kernels.triton._residual`).
    """
    draft_mode = 0 if step.draft is None else (2 if step.draft_norms is not None else 1)
    probs = step.target_norms is None
    return {
        "R": config.rows,
        "K1": config.k1,
        "COLS": config.cols,
        "BPI": config.blocks_per_iter,
        "NB_PAD": config.nb_pad,
        "TARGET_LOGITS": not probs,
        "DRAFT": draft_mode,
        "RULE": step.rule,
        "RAGGED": step.layout is not None,
        "BONUS_IDS": step.bonus is not None,
        "HAS_GREEDY": step.greedy is not None,
        "SAMPLED": step.uniforms is not None,
        "WIDE": probs and draft_mode == 1 and step.target.dtype == torch.float64,
        "FUSED": config.fused,
        "num_warps": config.warps,
        "enable_fp_fusion": False,
        "enable_reflect_ftz": False,
    }


def _launch(step: _Step) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the kernel; returns ``token_ids [batch, k + 1]`` and ``num_accepted [batch]``."""
    device = step.target.device
    token_ids = torch.empty(step.batch, step.k + 1, dtype=torch.int64, device=device)
    num_accepted = torch.empty(step.batch, dtype=torch.int64, device=device)
    if step.batch == 0:
        return token_ids, num_accepted
    config = _config(device, step.batch, step.vocab, step.k, step.positions)
    separate = step.uniforms is not None and not config.fused
    size = step.batch * step.positions * 2 * config.n_blocks if separate else 0
    masses = torch.empty(size, dtype=torch.float64, device=device)
    args = _arguments(step, config, masses, token_ids, num_accepted)
    constants = _constants(step, config)
    kernel = _kernel()
    tiles = -(-step.batch // config.rows)
    if separate:
        kernel[(tiles, step.positions, config.splits)](*args, **constants, PHASE=_MASSES)
    kernel[(tiles,)](*args, **constants, PHASE=_VERIFY)
    return token_ids, num_accepted


def _launch_masses(step: _Step) -> torch.Tensor:
    """The masses phase alone: ``[batch, positions, 2, blocks]`` float64, 0 where unwritten."""
    device = step.target.device
    config = _config(device, step.batch, step.vocab, step.k, step.positions)
    shape = (step.batch, step.positions, 2, config.n_blocks)
    masses = torch.zeros(shape, dtype=torch.float64, device=device)
    if masses.numel() == 0 or step.uniforms is None:
        return masses
    unset = torch.empty(1, dtype=torch.int64, device=device)
    args = _arguments(step, config, masses, unset, unset)
    tiles = -(-step.batch // config.rows)
    grid = (tiles, step.positions, config.splits)
    _kernel()[grid](*args, **_constants(step, config), PHASE=_MASSES)
    return masses


def _check_device(*tensors: torch.Tensor | None) -> None:
    """Raise unless the given tensors share one device on which the kernels can run."""
    device = next(t for t in tensors if t is not None).device
    for t in tensors:
        if t is not None and t.device != device:
            raise ValueError(f"all inputs must be on {device}, got one on {t.device}")
    if not supports(next(t for t in tensors if t is not None)):
        raise RuntimeError(
            "the Triton kernels run on CUDA tensors (or on any tensor with TRITON_INTERPRET=1)"
            + ("" if triton_available() else "; triton is not installed")
        )
