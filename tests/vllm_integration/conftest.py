"""Fixtures of the vLLM contract tests (``make test-vllm``, in an environment with vLLM).

Each test runs with torch's global generator forked and seeded, as the conformance tests do
(vLLM's sampler draws its unseeded numbers from it). On a machine without an accelerator,
vLLM finds no platform and still stages host-to-device copies in pinned memory, which only
an accelerator provides: the tests turn pinning off there (in every vLLM module that read
the flag), as vLLM's own CPU platform does.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _isolated_global_rng() -> Iterator[None]:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        yield


@pytest.fixture(autouse=True)
def _no_pinned_memory_without_accelerator(monkeypatch: pytest.MonkeyPatch) -> None:
    if torch.cuda.is_available():
        return
    for name, module in list(sys.modules.items()):
        if name.startswith("vllm") and getattr(module, "PIN_MEMORY", False) is True:
            monkeypatch.setattr(module, "PIN_MEMORY", False)
