"""Shared fixtures of the vLLM conformance tests.

Every test runs with torch's global generator forked and seeded, so tests that (like vLLM's)
draw their inputs or their unseeded verification randomness from the global stream are
reproducible and leave no trace on the tests that run after them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _isolated_global_rng() -> Iterator[None]:
    """Fork torch's global generator for the test and seed it with 0."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        yield


def _chi_square_p_value(samples: torch.Tensor, probs: torch.Tensor) -> float:
    """p-value of Pearson's goodness-of-fit test of ``samples`` (token ids) against ``probs``.

    Uses the asymptotic chi-square law with ``len(probs) - 1`` degrees of freedom; the tests
    keep every expected count above 1000, where the approximation is accurate.
    """
    probs = probs.to(torch.float64)
    n = samples.numel()
    observed = torch.bincount(samples.flatten(), minlength=probs.numel()).to(torch.float64)
    expected = n * probs
    statistic = ((observed - expected) ** 2 / expected).sum()
    dof = torch.tensor((probs.numel() - 1) / 2.0, dtype=torch.float64)
    return float(torch.special.gammaincc(dof, statistic / 2.0))


@pytest.fixture
def chi_square_p_value() -> Callable[[torch.Tensor, torch.Tensor], float]:
    """The goodness-of-fit p-value function (a fixture so test modules need no imports)."""
    return _chi_square_p_value
