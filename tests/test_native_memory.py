"""A tensor's memory read and written through its address (:mod:`specsample.kernels.cpu.memory`)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from specsample.kernels.cpu import compiler

pytestmark = pytest.mark.skipif(not compiler.available(), reason="needs numba")


def _kernels():  # type: ignore[no-untyped-def]
    """Small kernels over the helpers (compiled on first use, in this process only)."""
    from numba import njit

    from specsample.kernels.cpu.memory import load, row, store

    @njit
    def total(address: int, offset: int, length: int, marker: float) -> float:
        return float(row(address, offset, length, marker).sum())

    @njit
    def copy_element(source: int, i: int, target: int, j: int, marker: float) -> None:
        store(target, j, load(source, i, marker))

    return total, copy_element


def test_row_reads_contiguous_elements_from_an_offset() -> None:
    total, _ = _kernels()
    x = torch.arange(12, dtype=torch.float64).view(3, 4)
    assert total(x.data_ptr(), 4, 4, 0.0) == float(x[1].sum())
    y = x.to(torch.float32)
    assert total(y.data_ptr(), 8, 4, np.float32(0)) == float(y[2].sum())


def test_load_and_store_move_one_element_of_the_markers_type() -> None:
    _, copy_element = _kernels()
    source = torch.tensor([5, -7, 2**40], dtype=torch.int64)
    target = torch.zeros(4, dtype=torch.int64)
    copy_element(source.data_ptr(), 2, target.data_ptr(), 3, np.int64(0))
    copy_element(source.data_ptr(), 1, target.data_ptr(), 0, np.int64(0))
    assert target.tolist() == [-7, 0, 0, 2**40]
    halves = torch.tensor([0.5, 1.5], dtype=torch.float32)
    out = torch.zeros(2, dtype=torch.float32)
    copy_element(halves.data_ptr(), 1, out.data_ptr(), 1, np.float32(0))
    assert out.tolist() == [0.0, 1.5]
