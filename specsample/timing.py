"""The one timer: every timing loop of the project (benchmarks, the draft-length policy, the
command line's progress and speed-ups) reads its clock here.

A time read on an accelerator counts only once the device has finished the work queued
before it, so :func:`now` synchronises the device it is given (CUDA only; a CPU device, or
none, costs nothing). Code that must not synchronise (the verifier's hot path) never calls it.
:func:`per_call` times a run of calls as a whole, on a CUDA device between two events
recorded on the device itself.

Examples
--------
>>> watch = Stopwatch()
>>> watch.elapsed() >= 0.0
True
>>> times = repeat(lambda: sum(range(100)), repeats=3, warmup=1)
>>> len(times), all(t >= 0.0 for t in times)
(3, True)
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch


def synchronize(device: torch.device | None = None) -> None:
    """Wait until ``device`` has run the work queued on it (CUDA only; otherwise nothing).

    Examples
    --------
    >>> synchronize(torch.device("cpu"))
    """
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def now(device: torch.device | None = None) -> float:
    """Seconds on a monotonic clock, read once ``device`` has run the work queued on it.

    Parameters
    ----------
    device : torch.device, optional
        A CUDA device is synchronised first; any other device (or ``None``) is not.

    Examples
    --------
    >>> now() <= now()
    True
    """
    synchronize(device)
    return time.perf_counter()


class Stopwatch:
    """Wall-clock time since a start, on the clock of :func:`now`.

    Parameters
    ----------
    device : torch.device, optional
        Synchronised at every reading (CUDA only), so that queued work is counted.

    Examples
    --------
    >>> watch = Stopwatch()
    >>> first = watch.lap()
    >>> watch.elapsed() >= first >= 0.0
    True
    """

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device
        self.start = now(device)
        self._last = self.start

    def elapsed(self) -> float:
        """Seconds since the start."""
        return now(self.device) - self.start

    def lap(self) -> float:
        """Seconds since the previous lap (or the start), and start the next lap."""
        reading = now(self.device)
        lap, self._last = reading - self._last, reading
        return lap


def repeat(
    fn: Callable[[], object],
    *,
    repeats: int,
    warmup: int = 0,
    device: torch.device | None = None,
) -> list[float]:
    """Call ``fn`` ``warmup`` times untimed, then ``repeats`` times: the seconds of each.

    Parameters
    ----------
    fn : callable
        The work to time, called without arguments.
    repeats : int
        Timed calls, at least 1.
    warmup : int
        Untimed calls first, at least 0.
    device : torch.device, optional
        Synchronised around each timed call (CUDA only).

    Raises
    ------
    ValueError
        ``repeats < 1`` or ``warmup < 0``.

    Examples
    --------
    >>> len(repeat(lambda: None, repeats=2))
    2
    """
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}")
    if warmup < 0:
        raise ValueError(f"warmup must be at least 0, got {warmup}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = now(device)
        fn()
        times.append(now(device) - start)
    return times


def per_call(fn: Callable[[], object], *, calls: int, device: torch.device | None = None) -> float:
    """Mean seconds per call of ``calls`` back-to-back calls of ``fn``.

    On a CUDA device the span is read on the device, between two events recorded on its
    current stream before the first call and after the last (the host waits for the device
    before and after, never between calls); elsewhere it is read on the clock of :func:`now`.

    Parameters
    ----------
    fn : callable
        The work to time, called without arguments.
    calls : int
        Calls in the span, at least 1.
    device : torch.device, optional
        Where ``fn`` runs.

    Raises
    ------
    ValueError
        ``calls < 1``.

    Examples
    --------
    >>> per_call(lambda: sum(range(100)), calls=3) >= 0.0
    True
    """
    if calls < 1:
        raise ValueError(f"calls must be at least 1, got {calls}")
    if device is None or device.type != "cuda":
        start = now()
        for _ in range(calls):
            fn()
        return (now() - start) / calls
    synchronize(device)
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(calls):
        fn()
    end.record()
    synchronize(device)
    return begin.elapsed_time(end) / 1e3 / calls
