"""Run the benchmark: every contestant on every shape, one table row per shape."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from specsample.bench.contestants import (
    CONTESTANTS,
    SLOW,
    _contestant_calls,
    _find_transformers_sampler,
)
from specsample.bench.inputs import DEFAULT_SHAPES, Shape, check_shape, make_inputs
from specsample.bench.measure import Flusher, cache_flush_bytes, profile_calls
from specsample.kernels.cpu import compiler
from specsample.params.checks import check_int
from specsample.stats import expected_acceptance
from specsample.timing import Stopwatch


class _Setup(NamedTuple):
    """What every shape of one run shares."""

    repeats: int
    slow_repeats: int
    device: torch.device
    dtype: torch.dtype
    flush: Flusher
    hf: Callable[..., Any] | None
    hf_note: str


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den == 0 else num / den


def _measure_shape(shape: Shape, setup: _Setup, seed: int) -> dict[str, Any]:
    """One table row: alpha, then each contestant's extra peak memory and cold median."""
    batch, k, vocab = shape
    inputs = make_inputs(batch, k, vocab, device=setup.device, dtype=setup.dtype, seed=seed)
    unit = inputs.target_probs.numel() * inputs.target_probs.element_size()
    calls = _contestant_calls(inputs, setup.hf, seed)
    runnable = {name: fn for name, fn in calls.items() if fn is not None}
    note = setup.hf_note
    row: dict[str, Any] = {
        "batch": batch,
        "k": k,
        "vocab": vocab,
        "alpha": float(expected_acceptance(inputs.target_probs, inputs.draft_probs).mean()),
        "notes": [
            note if setup.hf is None or calls["hf"] else f"{note}: unknown signature, skipped"
        ],
    }
    counts = {name: setup.slow_repeats if name in SLOW else setup.repeats for name in runnable}
    profile = profile_calls(runnable, counts, setup.flush, setup.device, unit)
    row["others"] = profile.others
    for name in CONTESTANTS:
        row[f"{name}_ms"] = 1e3 * profile.medians[name] if name in profile.medians else None
        row[f"{name}_mem"] = profile.memory.get(name)
    row["speedup"] = _ratio(row["naive_ms"], row["ours_ms"])
    row["ours_over_floor"] = _ratio(row["ours_ms"], row["floor_ms"])
    row["torch_over_floor"] = _ratio(row["torch_ms"], row["floor_ms"])
    row["hf_over_ours"] = _ratio(row["hf_ms"], row["ours_ms"])
    return row


def _checked_device(
    repeats: int, slow_repeats: int, threads: int | None, device: str | torch.device
) -> torch.device:
    """Validate the run's options; return the device, which must be the CPU or CUDA."""
    check_int("repeats", repeats, 1)
    check_int("slow_repeats", slow_repeats, 1)
    if threads is not None:
        check_int("threads", threads, 1)
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"the benchmark runs on cpu or cuda, got {device}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was requested but CUDA is not available")
    return device


def _progress_line(
    index: int, total: int, shape: Shape, row: dict[str, Any], seconds: float
) -> str:
    return (
        f"[{index + 1}/{total}] batch={shape[0]} k={shape[1]} "
        f"vocab={shape[2]}: ours {row['ours_ms']:.3f} ms, "
        f"naive {row['naive_ms']:.1f} ms, floor {row['floor_ms']:.3f} ms "
        f"({seconds:.1f} s)"
    )


def _run_shapes(
    shapes: Sequence[Shape], setup: _Setup, nbytes: int, seed: int, progress: bool
) -> list[dict[str, Any]]:
    """:func:`run_benchmark` once its options are checked and the threads set."""
    method = {
        "device": str(setup.device),
        "dtype": str(setup.dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "repeats": setup.repeats,
        "slow_repeats": setup.slow_repeats,
        "flush_mib": nbytes / 2**20,
    }
    rows = []
    for index, shape in enumerate(shapes):
        watch = Stopwatch()
        row = _measure_shape(shape, setup, seed + index)
        row.update(method)
        rows.append(row)
        if progress:
            line = _progress_line(index, len(shapes), shape, row, watch.elapsed())
            print(line, file=sys.stderr, flush=True)
    return rows


def run_benchmark(
    shapes: Sequence[Sequence[int]] = DEFAULT_SHAPES,
    repeats: int = 7,
    slow_repeats: int = 3,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    threads: int | None = None,
    flush_bytes: int | None = None,
    seed: int = 0,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Time and measure the peak memory of every contestant on every shape.

    See the package docstring for the methodology. Contestants are interleaved: each round
    times every contestant once, each call after its own cache flush.

    Parameters
    ----------
    shapes : sequence of (batch, k, vocab)
        Shapes to run, each on freshly generated inputs (see :func:`make_inputs`).
    repeats : int
        Cold calls timed for ``ours``, ``torch`` and ``floor`` (the median is reported).
    slow_repeats : int
        Cold calls timed for ``naive`` and ``hf``.
    device : str or torch.device
        Where the inputs live and the verifiers run.
    dtype : torch.dtype
        Dtype of the probability tensors.
    threads : int, optional
        CPU threads torch may use during the run (unchanged by default; restored after).
    flush_bytes : int, optional
        Size of the buffer overwritten before every timed call; by default twice the
        last-level cache (the L2 on CUDA), at least :data:`MIN_FLUSH_BYTES`.
    seed : int
        Seed of the inputs and of the verifiers' generators.
    progress : bool
        Print one line per shape on stderr.

    Returns
    -------
    list of dict
        One row per shape with keys ``batch``, ``k``, ``vocab``, ``alpha`` (mean acceptance
        probability per position), ``{name}_ms`` (median milliseconds, ``None`` when the
        contestant did not run) and ``{name}_mem`` (extra peak memory in units of one
        ``[batch, k, vocab]`` tensor) for ``name`` in :data:`CONTESTANTS`, the ratios
        ``speedup`` (naive / ours), ``ours_over_floor``, ``torch_over_floor`` and
        ``hf_over_ours`` (``None`` when
        a side is missing), ``others`` (share of the machine's CPU time that other processes
        used during the timed calls, ``None`` where unknown), and the methodology:
        ``device``, ``dtype``, ``threads``, ``repeats``, ``slow_repeats``, ``flush_mib`` and
        ``notes``.

    Raises
    ------
    TypeError
        A shape is not three integers, or ``repeats``, ``slow_repeats`` or ``threads`` is not
        an int.
    ValueError
        A shape is out of range (see :func:`make_inputs`); ``repeats``, ``slow_repeats``,
        ``threads`` or ``flush_bytes`` is not positive; or the device is neither an available
        CUDA device nor the CPU.

    Examples
    --------
    >>> rows = run_benchmark([(2, 2, 64)], repeats=1, slow_repeats=1, flush_bytes=2**20,
    ...                      progress=False)
    >>> rows[0]["batch"], rows[0]["ours_ms"] > 0
    (2, True)
    """
    checked = [check_shape(tuple(shape)) for shape in shapes]
    device = _checked_device(repeats, slow_repeats, threads, device)
    nbytes = cache_flush_bytes(device) if flush_bytes is None else flush_bytes
    if nbytes < 4:
        raise ValueError(f"flush_bytes must be at least 4, got {nbytes}")
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        compiler.warm_up()
        flush = Flusher(device, nbytes)
        hf, hf_note = _find_transformers_sampler()
        setup = _Setup(repeats, slow_repeats, device, dtype, flush, hf, hf_note)
        return _run_shapes(checked, setup, nbytes, seed, progress)
    finally:
        torch.set_num_threads(previous_threads)
