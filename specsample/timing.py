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
>>> per_call(lambda: sum(range(100)), calls=3) >= 0.0
True
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from specsample.params.checks import check_int


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
    >>> watch.elapsed() >= 0.0
    True
    """

    def __init__(self, device: torch.device | None = None) -> None:
        self.device = device
        self.start = now(device)

    def elapsed(self) -> float:
        """Seconds since the start."""
        return now(self.device) - self.start


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
    TypeError
        ``calls`` is not an int.
    ValueError
        ``calls < 1``.

    Examples
    --------
    >>> per_call(lambda: sum(range(100)), calls=3) >= 0.0
    True
    """
    check_int("calls", calls, 1)
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
