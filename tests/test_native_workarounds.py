"""The compiler bugs the kernels work around, each still present.

Each test builds the smallest kernel with the pattern a workaround avoids and checks that
the compiler still gets it wrong. When one fails, the compiler is fixed: its docstring says
which workaround can go.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

numba = pytest.importorskip("numba")

from specsample.kernels.cpu.memory import row  # noqa: E402


def _write_columns(address: int, rows: int, width: int, column: int) -> None:
    """Write 7 into element ``column`` of each of ``rows`` int64 rows of ``width`` from
    ``address``, through an array of the row made in the loop and read nowhere after."""
    for r in numba.prange(rows):
        elements = row(address, r * width, width, np.int64(0))
        elements[column] = 7


def test_parallel_loops_drop_writes_into_an_array_made_in_the_loop() -> None:
    """numba's parallel loops drop a write into an array made inside the loop (here by
    :func:`~specsample.kernels.cpu.memory.row`) and read nowhere after it; compiled serially,
    the same loop writes.

    When this test fails, the compiler is fixed and the workaround at
    :func:`specsample.kernels.cpu.memory.store` can go: kernels writing their outputs with
    ``store`` instead of through :func:`~specsample.kernels.cpu.memory.row` arrays (the chain
    rule's tokens and accepted counts in :mod:`specsample.kernels.cpu.chain`, the activations'
    codes in :mod:`specsample.adapter.int_products`)."""
    serial, parallel = torch.zeros(4, 3, dtype=torch.int64), torch.zeros(4, 3, dtype=torch.int64)
    numba.njit(_write_columns)(serial.data_ptr(), 4, 3, 1)
    numba.njit(parallel=True)(_write_columns)(parallel.data_ptr(), 4, 3, 1)
    assert serial[:, 1].tolist() == [7] * 4, "the kernel itself is wrong"
    assert not parallel.any(), "numba now keeps the writes: memory.store's workaround can go"
