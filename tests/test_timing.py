"""The one timer, :mod:`specsample.timing`: clock readings, spans and argument checks."""

from __future__ import annotations

import time

import pytest
import torch

from specsample.timing import Stopwatch, now, per_call, synchronize


def test_spans_cover_the_work() -> None:
    """Every span holds the work it times: a 20 ms sleep reads at least 20 ms."""
    watch = Stopwatch(torch.device("cpu"))
    time.sleep(0.02)
    assert watch.elapsed() >= 0.02
    assert per_call(lambda: time.sleep(0.01), calls=2) >= 0.01


def test_per_call_calls_once_per_count() -> None:
    calls: list[int] = []
    per_call(lambda: calls.append(1), calls=5, device=torch.device("cpu"))
    assert len(calls) == 5


def test_cpu_device_needs_no_synchronisation() -> None:
    synchronize(torch.device("cpu"))
    synchronize(None)
    assert now(torch.device("cpu")) <= now()


def test_bad_counts_are_refused() -> None:
    with pytest.raises(ValueError, match="calls must be >= 1"):
        per_call(lambda: None, calls=0)
