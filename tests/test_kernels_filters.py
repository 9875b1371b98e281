"""The filter kernel (:mod:`specsample.kernels.triton.filters`) against PyTorch.

:func:`specsample.kernels.triton.filters.filtered_norms`, and the Triton backend's
``row_norms`` on a filtered batch, must give the :class:`~specsample.probs.RowNorms` of
:func:`specsample.probs.sampling_norms`: argmax, shift and cutoff exactly, ``log_norm`` to
float32 rounding, for top-k (of 1, of several, of the whole vocabulary and beyond, off),
top-p (off, of a tiny mass and of most of it), min-p, and all three together after each
other, on random, tied, all ``-inf``, NaN-containing and ``+inf`` rows, greedy, sampled
and mixed temperatures, the four logit dtypes, and searches made long by few pivots and by
values one float32 step apart.

Like ``tests/test_kernels_norms.py``, the kernel tests run under Triton's interpreter: in
the fresh process started by ``test_kernels.py::test_kernels_under_the_interpreter``, or
in-process when ``pytest`` itself was started with ``TRITON_INTERPRET=1``.
"""

from __future__ import annotations

import math
import sys
from typing import Any

import pytest
import torch

from specsample.backends import triton as triton_backend
from specsample.kernels.triton import filters
from specsample.kernels.triton.launch import MODE_PACKAGES
from specsample.params.metadata import SamplingMetadata
from specsample.probs import RowNorms, sampling_norms
from tests.test_kernels import requires_interpreter
from tests.test_kernels_norms import DTYPES, _rows

ROWS = 12

FILTERS: dict[str, dict[str, Any]] = {
    "top-k": {"top_k": [1, 3, 2, 0, 10**6, 7] * 2},
    "top-p": {"top_p": [0.5, 0.9, 1.0, 1e-4, 0.999, 0.3] * 2},
    "min-p": {"min_p": [0.0, 0.1, 0.5, 1.0, 0.02, 0.3] * 2},
    "all": {
        "top_k": [1, 3, 0, 5, 10**6, 7] * 2,
        "top_p": [0.5, 1.0, 0.9, 0.7, 0.95, 0.3] * 2,
        "min_p": [0.0, 0.1, 0.05, 0.0, 0.2, 0.01] * 2,
    },
}
TEMPERATURES = {"sampled": [0.7, 1.0, 1.3, 0.4], "mixed": [0.0, 0.8, 0.0, 1.5]}


def _assert_same(kernel: RowNorms, reference: RowNorms) -> None:
    """Argmax, cutoff and shift equal (NaN where the reference has NaN); log-norms to
    float32 rounding."""
    assert kernel.lazy is None and reference.lazy is None
    assert torch.equal(kernel.argmax, reference.argmax), (kernel.argmax, reference.argmax)
    for name in ("cutoff", "shift"):
        ours, theirs = getattr(kernel, name), getattr(reference, name)
        assert torch.equal(ours.isnan(), theirs.isnan()), name
        assert torch.equal(ours.nan_to_num(0.0), theirs.nan_to_num(0.0)), (name, ours, theirs)
    torch.testing.assert_close(
        kernel.log_norm, reference.log_norm, rtol=2e-6, atol=2e-6, equal_nan=True
    )


def _tied(vocab: int, seed: int) -> torch.Tensor:
    """``[ROWS, vocab]`` logits of a few distinct values each, so that thresholds fall on
    ties."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(-3, 2, (ROWS, vocab), generator=gen).float()


def test_filtered_batches_are_told_apart_on_the_host() -> None:
    """A batch runs the filter kernel exactly when a request may have a filter."""
    cpu = torch.device("cpu")
    assert not filters.filtered(SamplingMetadata.build(2, cpu, temperature=[0.0, 0.7]))
    assert not filters.filtered(SamplingMetadata.build(2, cpu, temperature=0.0, top_k=5))
    options: dict[str, Any] = {"top_k": 5, "top_p": 0.9, "min_p": 0.1}
    for name, value in options.items():
        assert filters.filtered(SamplingMetadata.build(2, cpu, **{name: value}))


@requires_interpreter
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_filtered_norms_equal_pytorch(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every filter and kind of row, on one block (vocab 5) and several (300: blocks of 128,
    the last partial), with 4 pivots per pass, and 2 for float32 logits."""
    monkeypatch.setattr(filters, "INTERPRETER_COLUMNS", 128)
    for vocab in (5, 300):
        for rows in (_rows(vocab, seed=vocab), _tied(vocab, seed=vocab)):
            logits = rows.to(dtype)
            for pivots in (2, 4) if dtype == torch.float32 else (4,):
                monkeypatch.setattr(filters, "INTERPRETER_PIVOTS", pivots)
                for options in FILTERS.values():
                    for temperature in TEMPERATURES.values():
                        sampling = SamplingMetadata.build(
                            ROWS, logits.device, temperature=temperature * 3, **options
                        )
                        kernel = filters.filtered_norms(logits, sampling)
                        _assert_same(kernel, sampling_norms(logits, sampling))


@requires_interpreter
def test_long_searches_end_on_the_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    """Values one float32 step apart next to values far apart, and logits up to ``1e30``,
    with two pivots a pass (the longest searches): the same thresholds."""
    monkeypatch.setattr(filters, "INTERPRETER_PIVOTS", 2)
    base = torch.full((4, 64), -2.0)
    steps = torch.arange(32, dtype=torch.int32) + base[0, 0].view(torch.int32)
    base[:, :32] = steps.view(torch.float32)
    base[1] *= torch.logspace(0, 30, 64)
    base[2, 40:] = -math.inf
    base[3] = torch.linspace(-1e30, 1e30, 64)
    sampling = SamplingMetadata.build(
        4, base.device, temperature=[1.0, 0.5, 2.0, 1.0], top_k=[17, 30, 30, 3], top_p=0.6
    )
    _assert_same(filters.filtered_norms(base, sampling), sampling_norms(base, sampling))


@requires_interpreter
def test_the_backend_runs_the_filter_kernel_only_when_it_is_needed() -> None:
    """A filtered batch of greedy requests needs argmaxes alone (no filter plays a part)
    unless normalisers are asked for; rows without a filter keep the one-pass norms."""
    logits = _rows(40, seed=3)
    greedy = SamplingMetadata.build(ROWS, logits.device, temperature=0.0, top_p=0.5)
    for need_norm in (False, True):
        kernel = triton_backend.row_norms(logits, greedy, need_norm=need_norm)
        _assert_same(kernel, sampling_norms(logits, greedy, need_norm=need_norm))
    some = SamplingMetadata.build(ROWS, logits.device, top_k=[0, 4] * 6)
    _assert_same(triton_backend.row_norms(logits, some), sampling_norms(logits, some))
    empty = filters.filtered_norms(torch.zeros(0, 7), SamplingMetadata.build(0, logits.device))
    assert all(field.shape == (0,) for field in empty[:5])


@requires_interpreter
def test_a_search_takes_at_most_eleven_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """With 8 pivots a pass, each search ends within 11 passes over its row (the span of
    float32 bit patterns, under 2**31, divided by 8 at each), on random rows and on values
    one float32 step apart; the passes are counted by wrapping the kernel's pass."""
    monkeypatch.setattr(filters, "INTERPRETER_PIVOTS", 8)
    filters._kernel()
    kernel_module = sys.modules[f"specsample.kernels.triton.{MODE_PACKAGES[True]}.filters"]
    passes = []

    def counted(*args: Any) -> Any:
        passes.append(1)
        return measure(*args)

    measure = kernel_module._measure
    monkeypatch.setattr(kernel_module, "_measure", counted)
    gen = torch.Generator().manual_seed(5)
    dense = torch.full((1, 256), -1.0)
    dense[0, :128] = (torch.arange(128, dtype=torch.int32) + dense[0, 0].view(torch.int32)).view(
        torch.float32
    )
    for logits in (torch.randn(1, 4000, generator=gen) * 3, dense):
        for options in ({"top_k": 50}, {"top_p": 0.9}, {"top_k": 100}, {"top_p": 0.3}):
            sampling = SamplingMetadata.build(1, logits.device, temperature=0.8, **options)
            passes.clear()
            _assert_same(filters.filtered_norms(logits, sampling), sampling_norms(logits, sampling))
            assert 0 < len(passes) <= 11, (options, len(passes))
