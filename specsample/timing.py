"""The one timer: every timing loop of the project (benchmarks, the draft-length policy, the
command line's progress and speed-ups) reads its clock here.

A time read on an accelerator counts only once the device has finished the work queued
before it, so :func:`now` synchronises the device it is given (CUDA only; a CPU device, or
none, costs nothing). Code that must not synchronise (the verifier's hot path) never calls it.

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
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)
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
