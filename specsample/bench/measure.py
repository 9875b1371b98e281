"""Cold-cache timing, peak memory and machine load, for any set of calls."""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

import torch

from specsample.timing import now, synchronize

MIN_FLUSH_BYTES = 768 * 2**20
"""Smallest cache-flush buffer; it grows to twice the last-level cache where that is larger."""


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
    """Bytes a cache flush overwrites on ``device``.

    Twice the last-level cache (the L2 on CUDA), at least :data:`MIN_FLUSH_BYTES`.

    Examples
    --------
    >>> cache_flush_bytes(torch.device("cpu")) >= MIN_FLUSH_BYTES
    True
    """
    if device.type == "cuda":
        cache = torch.cuda.get_device_properties(device).L2_cache_size
    else:
        cache = _last_level_cache_bytes()
    return max(MIN_FLUSH_BYTES, 2 * cache)


class Flusher:
    """Overwrites a buffer larger than the last-level cache, with a new value each time.

    Parameters
    ----------
    device : torch.device
        Where the buffer lives.
    nbytes : int
        Its size (a ``[nbytes // 4]`` float32 tensor).
    """

    def __init__(self, device: torch.device, nbytes: int) -> None:
        self.device = device
        self.buffer = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
        self.value = 0.0

    def __call__(self) -> None:
        self.value += 1.0
        self.buffer.fill_(self.value)
        synchronize(self.device)


def cold_medians(
    calls: dict[str, Callable[[], object]],
    counts: dict[str, int],
    flush: Flusher,
    device: torch.device,
) -> dict[str, float]:
    """Median seconds of cold calls, contestants interleaved round by round.

    Interleaving spreads any change of machine load over all contestants alike instead of
    letting it bias whichever one happened to run at that moment.

    Parameters
    ----------
    calls : dict of str to callable
        The contestants, each called with no arguments.
    counts : dict of str to int
        Timed calls of each contestant.
    flush : Flusher
        Run before every timed call.
    device : torch.device
        Synchronised after every call.

    Returns
    -------
    dict of str to float
        Median seconds per contestant.
    """
    times: dict[str, list[float]] = {name: [] for name in calls}
    for round_index in range(max(counts.values(), default=0)):
        for name, fn in calls.items():
            if round_index >= counts[name]:
                continue
            flush()
            start = now()
            fn()
            times[name].append(now(device) - start)
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
    >>> def step():
    ...     scratch = torch.empty(1000)  # 4000 bytes, freed on return
    ...     return torch.empty(2000)  # 8000 bytes, the result
    >>> extra_peak_bytes(step)
    12000
    """
    device = torch.device(device)
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        base = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        return max(0, torch.cuda.max_memory_allocated(device) - base)
    if device.type == "cpu":
        return _profiled_cpu_peak(fn)
    raise ValueError(f"peak memory is measured on cpu or cuda only, got {device}")


class CpuShare:
    """Share of the machine's CPU time that other processes used while the block ran.

    Reads the busy time of all CPUs from ``/proc/stat`` (time stolen by a hypervisor
    included) and subtracts this process's own CPU time; ``share`` stays ``None`` where
    ``/proc/stat`` is unavailable.

    Examples
    --------
    >>> with CpuShare() as contention:
    ...     _ = sum(range(1000))
    >>> contention.share is None or 0.0 <= contention.share <= 1.0
    True
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
        self._start = (self._busy_seconds(), sum(os.times()[:2]), now())
        return self

    def __exit__(self, *exc: object) -> None:
        busy, own, wall = self._busy_seconds(), sum(os.times()[:2]), now()
        start_busy, start_own, start_wall = self._start
        cpus = os.cpu_count() or 1
        if busy is None or start_busy is None or wall <= start_wall:
            return
        others = (busy - start_busy) - (own - start_own)
        self.share = min(max(others / ((wall - start_wall) * cpus), 0.0), 1.0)


class CallProfile(NamedTuple):
    """What :func:`profile_calls` measures.

    Attributes
    ----------
    medians : dict of str to float
        Median seconds of each call's cold runs.
    memory : dict of str to float
        Extra peak memory of each call, in units of ``unit`` bytes.
    others : float or None
        Share of the CPUs other processes used during the timed runs (see :class:`CpuShare`).
    """

    medians: dict[str, float]
    memory: dict[str, float]
    others: float | None


def profile_calls(
    calls: dict[str, Callable[[], object]],
    counts: dict[str, int],
    flush: Flusher,
    device: torch.device,
    unit: float,
) -> CallProfile:
    """Warm up every call, measure its extra peak memory, then time it cold.

    Everything runs without autograd. Each call runs once to warm up, once more under
    :func:`extra_peak_bytes`, then ``counts[name]`` times under :func:`cold_medians` inside a
    :class:`CpuShare` block.

    Parameters
    ----------
    calls : dict of str to callable
        The contestants, each called with no arguments.
    counts : dict of str to int
        Timed cold runs of each contestant.
    flush : Flusher
        Run before every timed call.
    device : torch.device
        Where the calls run.
    unit : float
        Bytes that memory is reported in units of (typically one input tensor).

    Returns
    -------
    CallProfile

    Examples
    --------
    >>> device = torch.device("cpu")
    >>> profile = profile_calls({"zeros": lambda: torch.zeros(100)}, {"zeros": 2},
    ...                         Flusher(device, 2**20), device, unit=400.0)
    >>> profile.memory["zeros"], profile.medians["zeros"] > 0
    (1.0, True)
    """
    with torch.no_grad():
        memory = {}
        for name, fn in calls.items():
            fn()
            memory[name] = extra_peak_bytes(fn, device) / unit
        with CpuShare() as contention:
            medians = cold_medians(calls, counts, flush, device)
    return CallProfile(medians, memory, contention.share)
