"""Top-k, top-p and min-p thresholds by selection (:mod:`specsample.kernels.cpu.filters`).

:func:`~specsample.kernels.cpu.filters.kth_largest` equals the ``k``-th value of the sorted row,
ties and ``-inf`` included, whatever the number of compactions;
:func:`~specsample.kernels.cpu.filters.top_p_cut` finds the threshold of a cumulative sum over the
sorted row, and calls a mass within its margin of ``top_p`` undecided. Through
:func:`specsample.backends.cpu.row_norms`, every filtered row gets PyTorch's own cutoff, value
for value, and its log-norm within float32 rounding: on random rows with ties, infinities,
NaN, ``top_k`` beyond the vocabulary and every mix of filters, including rows the selection
leaves undecided (which PyTorch then computes). Every test waits for the background
compilation first, and is skipped without numba.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch

from specsample.backends import cpu, eager
from specsample.kernels.cpu import compiler
from specsample.params.metadata import SamplingMetadata

pytestmark = pytest.mark.skipif(not compiler.available(), reason="the CPU backend needs numba")


@pytest.fixture(autouse=True, scope="module")
def _compiled() -> None:
    compiler.warm_up()
    assert compiler.ready()


@pytest.mark.parametrize(
    ("size", "k"), [(1, 1), (40, 1), (40, 40), (5000, 3), (5000, 39), (5000, 700)]
)
def test_kth_largest_is_the_kth_sorted_value(size: int, k: int) -> None:
    from specsample.kernels.cpu.filters import kth_largest
    from specsample.kernels.cpu.floats import BLOCK

    rng = np.random.default_rng(size + k)
    for trial in range(20):
        row = rng.standard_normal(size).astype(np.float32)
        if trial % 2:
            row = np.round(row * 2).astype(np.float32)  # many ties
        if trial % 5 == 0:
            row[: size // 2] = -np.inf
        if trial % 7 == 0:
            row = np.sort(row)  # rising: the bar rises on every block
        expected = np.sort(row)[::-1][k - 1]
        maxima = row[: size - size % BLOCK].reshape(-1, BLOCK).max(axis=1)
        buffer = np.empty(size, np.float32)
        got, n = kth_largest(row, maxima, k, buffer)
        assert got == expected or (np.isneginf(got) and np.isneginf(expected))
        assert np.sort(buffer[:n][buffer[:n] >= got]).tolist() == np.sort(row[row >= got]).tolist()


def test_top_p_cut_is_where_the_sorted_mass_reaches_top_p() -> None:
    from specsample.kernels.cpu.filters import top_p_cut

    rng = np.random.default_rng(0)
    for _ in range(50):
        z = -np.abs(rng.standard_normal(int(rng.integers(1, 400))) * 3).astype(np.float32)
        z[0] = 0.0
        top_p = float(np.float32(rng.uniform(0.01, 0.99)))
        ordered = np.sort(z)[::-1]
        cum = np.cumsum(np.exp(ordered.astype(np.float64)))
        expected = ordered[min(int((cum < top_p * cum[-1]).sum()), len(z) - 1)]
        cut, decided = top_p_cut(z.copy(), top_p, float(cum[-1]))
        if decided:
            assert cut == expected


def test_top_p_cut_leaves_a_mass_at_top_p_undecided() -> None:
    from specsample.kernels.cpu.filters import top_p_cut

    z = np.float32([0.0, -1.0, 0.0, -1.0])
    total = 2 + 2 * math.exp(-1)
    at_boundary = float(np.float32(1 / (1 + math.exp(-1))))  # the mass of z = 0, rounded
    assert not top_p_cut(z.copy(), at_boundary, total)[1]
    assert top_p_cut(z.copy(), at_boundary * 0.99, total) == (0.0, True)
    assert top_p_cut(z.copy(), at_boundary * 1.01, total) == (-1.0, True)
    assert top_p_cut(np.zeros(4, np.float32), 0.5, 4.0) == (0.0, True)  # ties: any crossing


def _rows(seed: int) -> tuple[torch.Tensor, dict[str, Any]]:
    """Random rows and per-row filters: ties, infinities, NaN, ``top_k`` beyond the
    vocabulary, filters switched off on some rows."""
    gen = torch.Generator().manual_seed(seed)
    rows = int(torch.randint(1, 9, (1,), generator=gen))
    vocab = int(torch.randint(2, 4000, (1,), generator=gen))
    logits = torch.randn(rows, vocab, generator=gen) * float(torch.rand(1, generator=gen) * 8)
    if seed % 4 == 0:
        logits = logits.round()
    if seed % 5 == 0:
        logits[:, : vocab // 3] = -math.inf
    if seed % 6 == 0:
        logits[0, vocab // 2] = math.inf
    if seed % 7 == 0 and rows > 1:
        logits[1, 0] = math.nan
    kw: dict[str, Any] = {"temperature": (torch.rand(rows, generator=gen) * 2 + 0.05).tolist()}
    if seed % 3 != 1:
        kw["top_k"] = torch.randint(0, vocab + 3, (rows,), generator=gen).tolist()
    if seed % 3 != 2:
        top_p = torch.rand(rows, generator=gen) * 0.999 + 0.001
        kw["top_p"] = torch.where(torch.rand(rows, generator=gen) < 0.2, 1.0, top_p).tolist()
    if seed % 4 == 1:
        kw["min_p"] = (torch.rand(rows, generator=gen) * 0.3).tolist()
    return logits, kw


def _assert_norms_agree(logits: torch.Tensor, sampling: SamplingMetadata) -> None:
    expected = eager.row_norms(logits, sampling, need_norm=True)
    got = cpu.row_norms(logits, sampling, need_norm=True)
    assert torch.equal(got.cutoff.isnan(), expected.cutoff.isnan())
    assert torch.equal(got.cutoff.nan_to_num(), expected.cutoff.nan_to_num())
    assert torch.equal(got.argmax, expected.argmax)
    assert torch.equal(got.shift, expected.shift)
    torch.testing.assert_close(got.log_norm, expected.log_norm, rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("seed", range(60))
def test_filtered_rows_get_pytorchs_cutoffs(seed: int) -> None:
    logits, kw = _rows(seed)
    _assert_norms_agree(logits, SamplingMetadata.build(logits.shape[0], logits.device, **kw))


def test_undecided_rows_take_pytorchs_statistics(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two levels of logits, ``top_p`` the mass of the upper one (rounded to float32): the
    selection cannot call the row, and PyTorch computes that row alone."""
    logits = torch.randn(3, 64)
    logits[1] = torch.tensor([0.0, -1.0]).repeat(32)
    at_boundary = 1 / (1 + math.exp(-1))
    sampling = SamplingMetadata.build(3, logits.device, top_p=[0.9, at_boundary, 0.9])
    seen: list[int] = []
    row_norms = eager.row_norms

    def recording(rows: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        seen.append(rows.shape[0])
        return row_norms(rows, *args, **kwargs)

    monkeypatch.setattr(eager, "row_norms", recording)
    _assert_norms_agree(logits, sampling)
    assert seen == [3, 1]  # the expected statistics, then the undecided row
