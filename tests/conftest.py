"""Shared test configuration: no network access, one torch thread, the hypothesis profiles.

The suite runs many small tensor operations, often on a shared machine (and in two worker
processes), where extra torch threads only stall: every test runs with one.

Two profiles are registered. ``ci`` (loaded by default, or by ``HYPOTHESIS_PROFILE``) is
derandomised, so a CI run is reproducible, and keeps hypothesis' default of 100 examples
per test. ``long`` (``pytest --hypothesis-profile=long``) explores at random with 20 times
as many: the fuzz suite (``tests/test_fuzz.py``) scales its per-test budgets by
``settings.default.max_examples / 100``, so ``long`` runs about 112,000 fuzz examples where
``ci`` runs about 5,600 (under a minute on two cores). Tests that fix their own
``max_examples`` keep it under both.

Every test starts after the fused CPU kernels have compiled (or loaded from their cache), so
no test sees the backend switch from PyTorch's code to the kernels halfway.

The loop's tests share the tiny random Llama models of ``tests/tiny_llama.py`` through the
fixtures ``pair`` (float64 target and draft), ``pair32`` (float32 copies) and
``greedy_reference`` (the target's greedy continuations of its prompts), built once per test
module; a test that needs them is skipped without ``transformers``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings

os.environ["HF_HUB_OFFLINE"] = "1"

_SUPPRESSED = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]

settings.register_profile(
    "ci",
    deadline=None,
    derandomize=True,
    database=None,
    print_blob=True,
    suppress_health_check=_SUPPRESSED,
)
settings.register_profile(
    "long",
    parent=settings.get_profile("ci"),
    derandomize=False,
    max_examples=2000,
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


@pytest.fixture(scope="session", autouse=True)
def compiled_kernels() -> None:
    """Wait for the fused CPU kernels (when numba is installed) before any test: a call made
    while they compile runs the PyTorch code, whose log-probabilities differ from the
    kernels' in the last bits, so a test comparing two calls bit for bit must not straddle
    the end of the compilation. ``make test`` compiles them once beforehand, into the cache
    every worker then loads. Tests of the calls made before compilation fake it."""
    from specsample.kernels.cpu import compiler

    compiler.warm_up()


@pytest.fixture(scope="session", autouse=True)
def one_thread() -> Iterator[None]:
    """One torch thread for the whole run."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def pair() -> tuple[Any, Any]:
    """A 2-layer float64 Llama target and its perturbed 1-layer draft."""
    from tests.tiny_llama import make_pair

    return make_pair()


@pytest.fixture(scope="module")
def pair32(pair: tuple[Any, Any]) -> tuple[Any, Any]:
    """Float32 copies of ``pair``."""
    return copy.deepcopy(pair[0]).float(), copy.deepcopy(pair[1]).float()


@pytest.fixture(scope="module")
def greedy_reference(pair: tuple[Any, Any]) -> list[list[int]]:
    """``transformers``' greedy 24 tokens after each prompt of ``tests.tiny_llama.PROMPTS``."""
    from tests.tiny_llama import PROMPTS, hf_greedy

    return [hf_greedy(pair[0], p, 24) for p in PROMPTS]
