"""Cold-cache latency and peak-memory benchmark of the verification step.

For each shape ``(batch, k, vocab)`` one run times, on the same inputs:

* ``ours``: :class:`specsample.sampler.RejectionSampler`;
* ``naive``: :func:`specsample.reference.naive_rejection_sample`, which builds the residual
  and draws a recovered token at every position (``[batch, k, vocab]`` temporaries);
* ``hf``: transformers' ``_speculative_sampling`` (Algorithm 1 of Leviathan et al.), when
  transformers can be imported. It verifies one sequence per call and takes logits, so it is
  called once per sequence on ``log(probs)`` prepared beforehand and applies its own softmax;
* ``floor``: one read of the rows any exact verifier must read, the target and draft rows at
  one position per sequence (``2 * batch * vocab`` elements), as ``target[:, 0].sum(-1)``
  and ``draft[:, 0].sum(-1)``.

Methodology
-----------
Inputs are realistic: target rows are ``softmax(4 z)`` with ``z ~ N(0, 1)``, draft rows are
the softmax of correlated logits (``4 (0.98 z + 0.2 z')``), the drafts are sampled from the
draft rows and the bonus tokens from one more target row, so acceptance is what such rows
give (the ``alpha`` column: mean ``sum_x min(q, p)`` per position). A verifier meets its
inputs right after the target model's forward pass, with caches full of other data, so every
call is timed *cold*: before each timed call a buffer larger than the last-level cache
(at least 768 MiB) is overwritten, and every contestant, the floor included, reads its inputs
from memory. Each contestant is warmed up once; then rounds of cold calls interleave the
contestants (one call of each per round, each after its own flush) and the median of each
contestant's calls is reported (fewer calls for the slow naive and transformers contestants).
On a shared machine other processes inflate multi-threaded timings, so the share of the CPUs
they used during the timed calls is reported too (``others``). Peak memory is the largest
number of bytes allocated during one call beyond its inputs (the output included), reported
as a multiple of one ``[batch, k, vocab]`` probability tensor: on CUDA from
:func:`torch.cuda.max_memory_allocated`, on the CPU from the allocation and free events that
:mod:`torch.profiler` records with ``profile_memory=True``. Timings depend on the machine
and its load; they are never used as a pass/fail criterion.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.util
import inspect
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch

from specsample.reference import naive_rejection_sample
from specsample.sampler import RejectionSampler
from specsample.stats import expected_acceptance

__all__ = [
    "DEFAULT_SHAPES",
    "QUICK_SHAPES",
    "BenchInputs",
    "CpuShare",
    "Flusher",
    "add_arguments",
    "cache_flush_bytes",
    "cold_medians",
    "extra_peak_bytes",
    "format_table",
    "make_inputs",
    "parse_positive_int",
    "parse_shape",
    "run_benchmark",
    "run_from_args",
]

Shape = tuple[int, int, int]

DEFAULT_SHAPES: tuple[Shape, ...] = (
    (1, 4, 32000),
    (8, 4, 32000),
    (64, 4, 128256),
    (16, 5, 151936),
    (128, 8, 32000),
)
"""``(batch, k, vocab)`` shapes of the full benchmark (Llama-2, Llama-3 and Qwen2 vocabularies)."""

QUICK_SHAPES: tuple[Shape, ...] = ((8, 4, 32000), (64, 4, 128256))
"""A small subset for a quick look."""

MIN_FLUSH_BYTES = 768 * 2**20
"""Smallest cache-flush buffer; it grows to twice the last-level cache where that is larger."""

CONTESTANTS = ("ours", "naive", "hf", "floor")
"""Names of the timed contestants."""

SLOW = ("naive", "hf")
"""Contestants timed ``slow_repeats`` times rather than ``repeats`` times."""

_TARGET_SCALE = 4.0
_DRAFT_MIX = 0.2


class BenchInputs(NamedTuple):
    """Inputs of one benchmark shape.

    Attributes
    ----------
    target_probs : torch.Tensor
        ``[batch, k, vocab]`` target rows ``q``.
    bonus_token_ids : torch.Tensor
        ``[batch, 1]`` int64, sampled from ``bonus_probs``.
    draft_probs : torch.Tensor
        ``[batch, k, vocab]`` draft rows ``p``.
    draft_token_ids : torch.Tensor
        ``[batch, k]`` int64, sampled from ``draft_probs``.
    bonus_probs : torch.Tensor
        ``[batch, vocab]`` the target row after the last draft.
    """

    target_probs: torch.Tensor
    bonus_token_ids: torch.Tensor
    draft_probs: torch.Tensor
    draft_token_ids: torch.Tensor
    bonus_probs: torch.Tensor


def _check_shape(shape: Sequence[int]) -> Shape:
    if len(shape) != 3 or not all(isinstance(n, int) and not isinstance(n, bool) for n in shape):
        raise TypeError(f"a shape must be three integers (batch, k, vocab), got {shape!r}")
    batch, k, vocab = shape
    if batch < 1 or k < 1 or vocab < 2:
        raise ValueError(f"a shape needs batch >= 1, k >= 1 and vocab >= 2, got {tuple(shape)}")
    return batch, k, vocab


def make_inputs(
    batch: int,
    k: int,
    vocab: int,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
) -> BenchInputs:
    """Realistic verifier inputs: softmax rows, drafts sampled from the draft rows.

    Target logits are ``4 z`` and draft logits ``4 (0.98 z + 0.2 z')`` with independent
    standard normal ``z, z'``, which gives an acceptance ``sum_x min(q, p)`` of about 0.7 per
    position.

    Parameters
    ----------
    batch, k, vocab : int
        Sequences, drafts per sequence, vocabulary size.
    device : str or torch.device
        Where the tensors live.
    dtype : torch.dtype
        Dtype of the probability tensors.
    seed : int
        Seed of the generator that draws everything.

    Returns
    -------
    BenchInputs
        ``target_probs`` and ``draft_probs`` ``[batch, k, vocab]``, ``bonus_token_ids``
        ``[batch, 1]``, ``draft_token_ids`` ``[batch, k]``, ``bonus_probs`` ``[batch, vocab]``.

    Examples
    --------
    >>> inputs = make_inputs(2, 3, 50)
    >>> tuple(inputs.target_probs.shape), tuple(inputs.draft_token_ids.shape)
    ((2, 3, 50), (2, 3))
    """
    batch, k, vocab = _check_shape((batch, k, vocab))
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)
    z = torch.randn(batch, k + 1, vocab, generator=gen, device=device)
    noise = torch.randn(batch, k, vocab, generator=gen, device=device)
    target = torch.softmax(_TARGET_SCALE * z, dim=-1)
    mix = (1.0 - _DRAFT_MIX**2) ** 0.5
    draft = torch.softmax(_TARGET_SCALE * (mix * z[:, :k] + _DRAFT_MIX * noise), dim=-1)
    draft_ids = torch.multinomial(draft.view(-1, vocab), 1, generator=gen).view(batch, k)
    bonus_ids = torch.multinomial(target[:, k], 1, generator=gen)
    return BenchInputs(
        target[:, :k].to(dtype).contiguous(),
        bonus_ids,
        draft.to(dtype),
        draft_ids,
        target[:, k].to(dtype).contiguous(),
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _last_level_cache_bytes() -> int:
    """Size of the largest CPU cache listed in sysfs, 0 when unknown."""
    sizes = [0]
    for entry in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = entry.read_text().strip().upper()
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            sizes.append(int(digits) * scale)
    return max(sizes)


def cache_flush_bytes(device: torch.device) -> int:
    if device.type == "cuda":
        cache = torch.cuda.get_device_properties(device).L2_cache_size
    else:
        cache = _last_level_cache_bytes()
    return max(MIN_FLUSH_BYTES, 2 * cache)


class Flusher:
    """Overwrites a buffer larger than the last-level cache, with a new value each time."""

    def __init__(self, device: torch.device, nbytes: int) -> None:
        self.device = device
        self.buffer = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
        self.value = 0.0

    def __call__(self) -> None:
        self.value += 1.0
        self.buffer.fill_(self.value)
        _sync(self.device)


def cold_medians(
    calls: dict[str, Callable[[], object]],
    counts: dict[str, int],
    flush: Flusher,
    device: torch.device,
) -> dict[str, float]:
    """Median seconds of cold calls, contestants interleaved round by round.

    Interleaving spreads any change of machine load over all contestants alike instead of
    letting it bias whichever one happened to run at that moment.
    """
    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_index in range(max(counts.values(), default=0)):
        for name, fn in calls.items():
            if round_index >= counts[name]:
                continue
            flush()
            start = time.perf_counter()
            fn()
            _sync(device)
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """Send the process's standard error to the null device (the profiler logs its start)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _profiled_cpu_peak(fn: Callable[[], object]) -> int:
    """Peak of the running sum of CPU allocations and frees recorded during ``fn()``."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    with _stderr_silenced(), profile(activities=activities, profile_memory=True) as prof:
        fn()
    events = []
    pending = list(prof.profiler.kineto_results.experimental_event_tree())
    while pending:
        event = pending.pop()
        pending.extend(event.children)
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            events.append((event.start_time_ns, event.extra_fields.alloc_size))
    running = peak = 0
    for _, size in sorted(events, key=lambda item: item[0]):
        running += size
        peak = max(peak, running)
    return peak


def extra_peak_bytes(fn: Callable[[], object], device: str | torch.device = "cpu") -> int:
    """Largest number of bytes allocated during ``fn()`` beyond what was allocated before.

    Parameters
    ----------
    fn : callable
        Called once with no arguments; what it returns is released after the measurement.
    device : str or torch.device
        ``cpu`` (measured with :mod:`torch.profiler`'s memory events) or ``cuda``
        (measured with :func:`torch.cuda.max_memory_allocated`).

    Returns
    -------
    int
        Peak extra bytes, the result of ``fn`` included.

    Raises
    ------
    ValueError
        For another device type.

    Examples
    --------
    >>> import torch
    >>> def step():
    ...     scratch = torch.empty(1000)  # 4000 bytes, freed on return
    ...     return torch.empty(2000)  # 8000 bytes, the result
    >>> extra_peak_bytes(step)
    12000
    """
    device = torch.device(device)
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        _sync(device)
        return max(0, torch.cuda.max_memory_allocated(device) - base)
    if device.type == "cpu":
        return _profiled_cpu_peak(fn)
    raise ValueError(f"peak memory is measured on cpu or cuda only, got {device}")


_HF_MODULES = ("transformers.generation.utils", "transformers.generation.candidate_generator")


def _find_transformers_sampler() -> tuple[Callable[..., Any] | None, str]:
    """transformers' ``_speculative_sampling`` and a note on what was found."""
    if importlib.util.find_spec("transformers") is None:
        return None, "hf: transformers is not installed; skipped"
    try:
        import transformers

        version = getattr(transformers, "__version__", "?")
        for name in _HF_MODULES:
            fn = getattr(importlib.import_module(name), "_speculative_sampling", None)
            if callable(fn):
                return fn, f"hf: {name}._speculative_sampling from transformers {version}"
    except Exception as exc:
        return None, f"hf: transformers failed to import ({type(exc).__name__}: {exc}); skipped"
    return None, f"hf: transformers {version} has no _speculative_sampling; skipped"


_HF_ARGUMENTS = ("candidate_input_ids", "candidate_logits", "candidate_length", "new_logits")


def _transformers_call(fn: Callable[..., Any], inputs: BenchInputs) -> Callable[[], object] | None:
    """A call of ``fn`` on every sequence of ``inputs``, or ``None`` for an unknown signature.

    The logits are prepared here, outside the timed call: ``log`` of the draft rows
    ``[batch, 1, k, vocab]`` and of the target rows plus the bonus row
    ``[batch, 1, k + 1, vocab]``, whose softmax gives back the probabilities.
    """
    params = inspect.signature(fn).parameters
    batch, k, _ = inputs.target_probs.shape
    extra: dict[str, object] = {}
    for name, value in (
        ("is_done_candidate", False),
        ("last_assistant_token_is_eos", False),
        ("max_matches", k),
    ):
        if name in params:
            extra[name] = value
    known = set(_HF_ARGUMENTS) | set(extra)
    required = {n for n, p in params.items() if p.default is inspect.Parameter.empty}
    if not set(_HF_ARGUMENTS) <= set(params) or not required <= known:
        return None
    draft_logits = inputs.draft_probs.log().unsqueeze(1)
    target_rows = torch.cat([inputs.target_probs, inputs.bonus_probs.unsqueeze(1)], dim=1)
    target_logits = target_rows.log().unsqueeze(1)
    ids = inputs.draft_token_ids.unsqueeze(1)

    def call() -> object:
        return [
            fn(
                candidate_input_ids=ids[b],
                candidate_logits=draft_logits[b],
                candidate_length=k,
                new_logits=target_logits[b],
                **extra,
            )
            for b in range(batch)
        ]

    return call


def _contestants(
    inputs: BenchInputs, hf: Callable[..., Any] | None, seed: int
) -> dict[str, Callable[[], object] | None]:
    target, bonus, draft, ids, _ = inputs
    gen = torch.Generator(device=target.device).manual_seed(seed)
    sampler = RejectionSampler()
    return {
        "ours": lambda: sampler(target, bonus, draft, ids, generator=gen),
        "naive": lambda: naive_rejection_sample(target, bonus, draft, ids, generator=gen),
        "hf": _transformers_call(hf, inputs) if hf is not None else None,
        "floor": lambda: (target[:, 0].sum(-1), draft[:, 0].sum(-1)),
    }


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if num is None or den is None or den == 0 else num / den


class CpuShare:
    """Share of the machine's CPU time that other processes used while the block ran.

    Reads the busy time of all CPUs from ``/proc/stat`` (time stolen by a hypervisor
    included) and subtracts this process's own CPU time; ``share`` stays ``None`` where
    ``/proc/stat`` is unavailable.
    """

    def __init__(self) -> None:
        self.share: float | None = None

    @staticmethod
    def _busy_seconds() -> float | None:
        try:
            with open("/proc/stat") as stat:
                fields = [int(v) for v in stat.readline().split()[1:]]
        except (OSError, ValueError):
            return None
        idle = sum(fields[3:5])
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    def __enter__(self) -> CpuShare:
        self._start = (self._busy_seconds(), sum(os.times()[:2]), time.perf_counter())
        return self

    def __exit__(self, *exc: object) -> None:
        busy, own, wall = self._busy_seconds(), sum(os.times()[:2]), time.perf_counter()
        start_busy, start_own, start_wall = self._start
        cpus = os.cpu_count() or 1
        if busy is None or start_busy is None or wall <= start_wall:
            return
        others = (busy - start_busy) - (own - start_own)
        self.share = min(max(others / ((wall - start_wall) * cpus), 0.0), 1.0)


def _measure_shape(
    shape: Shape,
    *,
    repeats: int,
    slow_repeats: int,
    device: torch.device,
    dtype: torch.dtype,
    flush: Flusher,
    hf: Callable[..., Any] | None,
    hf_note: str,
    seed: int,
) -> dict[str, Any]:
    """One table row: alpha, then each contestant's extra peak memory and cold median."""
    batch, k, vocab = shape
    inputs = make_inputs(batch, k, vocab, device=device, dtype=dtype, seed=seed)
    unit = inputs.target_probs.numel() * inputs.target_probs.element_size()
    calls = _contestants(inputs, hf, seed)
    runnable = {name: fn for name, fn in calls.items() if fn is not None}
    row: dict[str, Any] = {
        "batch": batch,
        "k": k,
        "vocab": vocab,
        "alpha": float(expected_acceptance(inputs.target_probs, inputs.draft_probs).mean()),
        "notes": [
            hf_note if hf is None or calls["hf"] else f"{hf_note}: unknown signature, skipped"
        ],
    }
    with torch.no_grad():
        memory = {}
        for name, fn in runnable.items():
            fn()
            memory[name] = extra_peak_bytes(fn, device) / unit
        counts = {name: slow_repeats if name in SLOW else repeats for name in runnable}
        with CpuShare() as contention:
            medians = cold_medians(runnable, counts, flush, device)
    row["others"] = contention.share
    for name in CONTESTANTS:
        row[f"{name}_ms"] = 1e3 * medians[name] if name in medians else None
        row[f"{name}_mem"] = memory.get(name)
    row["speedup"] = _ratio(row["naive_ms"], row["ours_ms"])
    row["ours_over_floor"] = _ratio(row["ours_ms"], row["floor_ms"])
    row["hf_over_ours"] = _ratio(row["hf_ms"], row["ours_ms"])
    return row


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

    See the module docstring for the methodology. Contestants are interleaved: each round
    times every contestant once, each call after its own cache flush.

    Parameters
    ----------
    shapes : sequence of (batch, k, vocab)
        Shapes to run, each on freshly generated inputs (see :func:`make_inputs`).
    repeats : int
        Cold calls timed for ``ours`` and ``floor`` (the median is reported).
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
        ``speedup`` (naive / ours), ``ours_over_floor`` and ``hf_over_ours`` (``None`` when
        a side is missing), ``others`` (share of the machine's CPU time that other processes
        used during the timed calls, ``None`` where unknown), and the methodology:
        ``device``, ``dtype``, ``threads``, ``repeats``, ``slow_repeats``, ``flush_mib`` and
        ``notes``.

    Raises
    ------
    TypeError
        A shape is not three integers.
    ValueError
        A shape is out of range; ``repeats``, ``slow_repeats``, ``threads`` or
        ``flush_bytes`` is not positive; or the device is neither an available CUDA device
        nor the CPU.

    Examples
    --------
    >>> rows = run_benchmark([(2, 2, 64)], repeats=1, slow_repeats=1, flush_bytes=2**20,
    ...                      progress=False)
    >>> rows[0]["batch"], rows[0]["ours_ms"] > 0
    (2, True)
    """
    checked = [_check_shape(tuple(shape)) for shape in shapes]
    if repeats < 1 or slow_repeats < 1:
        raise ValueError(f"repeats and slow_repeats must be >= 1, got {repeats}, {slow_repeats}")
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    device = torch.device(device)
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"the benchmark runs on cpu or cuda, got {device}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device cuda was requested but CUDA is not available")
    nbytes = cache_flush_bytes(device) if flush_bytes is None else flush_bytes
    if nbytes < 4:
        raise ValueError(f"flush_bytes must be at least 4, got {nbytes}")
    previous_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        flush = Flusher(device, nbytes)
        hf, hf_note = _find_transformers_sampler()
        method = {
            "device": str(device),
            "dtype": str(dtype).removeprefix("torch."),
            "threads": torch.get_num_threads(),
            "repeats": repeats,
            "slow_repeats": slow_repeats,
            "flush_mib": nbytes / 2**20,
        }
        rows = []
        for index, shape in enumerate(checked):
            start = time.perf_counter()
            row = _measure_shape(
                shape,
                repeats=repeats,
                slow_repeats=slow_repeats,
                device=device,
                dtype=dtype,
                flush=flush,
                hf=hf,
                hf_note=hf_note,
                seed=seed + index,
            )
            row.update(method)
            rows.append(row)
            if progress:
                print(
                    f"[{index + 1}/{len(checked)}] batch={shape[0]} k={shape[1]} "
                    f"vocab={shape[2]}: ours {row['ours_ms']:.3f} ms, "
                    f"naive {row['naive_ms']:.1f} ms, floor {row['floor_ms']:.3f} ms "
                    f"({time.perf_counter() - start:.1f} s)",
                    file=sys.stderr,
                    flush=True,
                )
    finally:
        torch.set_num_threads(previous_threads)
    return rows


def _percent(value: float | None) -> float | None:
    return None if value is None else 100.0 * value


_COLUMNS: tuple[tuple[str, str, int, int, str], ...] = (
    ("batch", "batch", 5, 0, ""),
    ("k", "k", 2, 0, ""),
    ("vocab", "vocab", 6, 0, ""),
    ("alpha", "alpha", 5, 2, ""),
    ("others", "others", 6, 0, "%"),
    ("|", "", 0, 0, ""),
    ("ours ms", "ours_ms", 8, 3, ""),
    ("floor ms", "floor_ms", 8, 3, ""),
    ("naive ms", "naive_ms", 9, 2, ""),
    ("hf ms", "hf_ms", 8, 2, ""),
    ("|", "", 0, 0, ""),
    ("naive/ours", "speedup", 10, 1, "x"),
    ("ours/floor", "ours_over_floor", 10, 2, "x"),
    ("hf/ours", "hf_over_ours", 8, 1, "x"),
    ("|", "", 0, 0, ""),
    ("mem ours", "ours_mem", 8, 3, ""),
    ("naive", "naive_mem", 6, 2, ""),
    ("hf", "hf_mem", 6, 2, ""),
    ("floor", "floor_mem", 6, 3, ""),
)
"""Table columns: title, row key, width, decimals, suffix (``|`` separates groups)."""


def _cell(value: float | None, width: int, digits: int, suffix: str) -> str:
    text = "-" if value is None else f"{value:.{digits}f}{suffix}"
    return f"{text:>{width}}"


def format_table(rows: Sequence[dict[str, Any]]) -> str:
    """Render :func:`run_benchmark` rows as a plain-text table with its methodology header.

    Examples
    --------
    >>> rows = run_benchmark([(2, 2, 64)], repeats=1, slow_repeats=1, flush_bytes=2**20,
    ...                      progress=False)
    >>> print(format_table(rows).splitlines()[0])  # doctest: +ELLIPSIS
    Verification latency, cold caches (cpu, float32, ...
    """
    if not rows:
        return "(no shapes benchmarked)"
    first = rows[0]
    lines = [
        f"Verification latency, cold caches ({first['device']}, {first['dtype']}, "
        f"{first['threads']} threads, torch {torch.__version__})",
        f"Before every timed call a {first['flush_mib']:.0f} MiB buffer is overwritten, so each "
        "contestant, the floor included, reads its inputs from memory;",
        f"median of {first['repeats']} cold calls after one warm-up "
        f"({first['slow_repeats']} for naive and hf), contestants interleaved. Inputs: softmax "
        "rows, drafts sampled from the draft rows.",
        "alpha = mean acceptance probability per position. floor = one read of the target and "
        "draft rows at one position per sequence.",
        "others = share of the CPUs used by other processes during the timed calls; above a few "
        "% they slow multi-threaded calls.",
        "mem = extra peak memory during one call, in units of one [batch, k, vocab] probs tensor.",
        "",
    ]
    header = " ".join("|" if t == "|" else f"{t:>{w}}" for t, _, w, _, _ in _COLUMNS)
    lines += [header, "-" * len(header)]
    for row in rows:
        values = dict(row, others=_percent(row.get("others")))
        lines.append(
            " ".join(
                "|" if title == "|" else _cell(values[key], width, digits, suffix)
                for title, key, width, digits, suffix in _COLUMNS
            )
        )
    notes = dict.fromkeys(note for row in rows for note in row["notes"])
    lines += ["", *notes]
    return "\n".join(lines)


def parse_shape(text: str) -> Shape:
    """Parse ``BATCHxKxVOCAB`` (for example ``8x4x32000``) into a shape.

    Raises
    ------
    argparse.ArgumentTypeError
        The text is not three positive integers separated by ``x``.

    Examples
    --------
    >>> parse_shape("8x4x32000")
    (8, 4, 32000)
    """
    parts = text.lower().split("x")
    if len(parts) != 3 or not all(part.strip().isdigit() for part in parts):
        raise argparse.ArgumentTypeError(f"expected BATCHxKxVOCAB such as 8x4x32000, got {text!r}")
    try:
        return _check_shape(tuple(int(part) for part in parts))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def parse_positive_int(text: str) -> int:
    """Parse a positive integer command-line value.

    Raises
    ------
    argparse.ArgumentTypeError
        The text is not an integer ``>= 1``.

    Examples
    --------
    >>> parse_positive_int("7")
    7
    """
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's options to ``parser``.

    ``--quick``, ``--shapes``, ``--repeats``, ``--threads`` and ``--device``; read back by
    :func:`run_from_args`.
    """
    parser.add_argument(
        "--quick",
        action="store_true",
        help="run only "
        + ", ".join("x".join(map(str, s)) for s in QUICK_SHAPES)
        + " with fewer repeats",
    )
    parser.add_argument(
        "--shapes",
        nargs="+",
        type=parse_shape,
        metavar="BxKxV",
        help="shapes to run, such as 8x4x32000 (default: the five standard shapes)",
    )
    parser.add_argument(
        "--repeats",
        type=parse_positive_int,
        default=None,
        help="cold calls timed for ours and the floor (default 7, --quick 3); "
        "naive and transformers get at most 3",
    )
    parser.add_argument(
        "--threads", type=parse_positive_int, default=None, help="CPU threads torch may use"
    )
    parser.add_argument("--device", default="cpu", help="torch device (default cpu)")


def run_from_args(args: argparse.Namespace) -> int:
    """Run the benchmark as :func:`add_arguments` configured it and print the table.

    Returns
    -------
    int
        The exit status, 0.
    """
    shapes = args.shapes or (QUICK_SHAPES if args.quick else DEFAULT_SHAPES)
    repeats = args.repeats or (3 if args.quick else 7)
    rows = run_benchmark(
        shapes,
        repeats=repeats,
        slow_repeats=min(repeats, 3),
        device=args.device,
        threads=args.threads,
    )
    print(format_table(rows))
    return 0
