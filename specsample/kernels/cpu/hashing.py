"""The counter-based uniforms of :mod:`specsample.random` on CPU arrays, as one loop.

:func:`hash_uniform` is the CPU kernel of the ``specsample::hash_uniform`` operator: what its
chain of PyTorch integer operations computes (32-bit "lowbias32" mixers), in integer
arithmetic, so the same numbers bit for bit, without the dozens of small tensor operations.
"""

from __future__ import annotations

import numpy as np

from specsample.kernels.cpu.compiler import njit

_MASK = np.uint64(0xFFFFFFFF)
_GOLDEN = np.uint64(0x9E3779B9)
_MUL_1 = np.uint64(0x7FEB352D)
_MUL_2 = np.uint64(0x846CA68B)
_GRID = 1.0 / 4294967296.0


@njit(inline="always")
def _mix32(x: np.uint64) -> np.uint64:
    """The lowbias32 mixer of ``specsample.random`` on a value in ``[0, 2**32)``: products of
    two values below ``2**32`` fit in 64 bits, so no product wraps before the mask."""
    x = x ^ (x >> np.uint64(16))
    x = (x * _MUL_1) & _MASK
    x = x ^ (x >> np.uint64(15))
    x = (x * _MUL_2) & _MASK
    return x ^ (x >> np.uint64(16))


@njit
def hash_uniform(key: np.ndarray, counters: np.ndarray, out: np.ndarray) -> None:
    """``out [batch, n]`` float64: the uniform of each row's ``key [batch]`` (int64 in
    ``[0, 2**32)``) and each of its ``counters [batch, n]`` (non-negative int64), on the grid
    ``j * 2**-32``."""
    for b in range(counters.shape[0]):
        k = np.uint64(key[b])
        for j in range(counters.shape[1]):
            c = np.uint64(counters[b, j])
            inner = _mix32(((c >> np.uint64(32)) & _MASK) ^ _GOLDEN)
            out[b, j] = np.float64(_mix32(k ^ _mix32((c & _MASK) ^ inner))) * _GRID


def warm() -> None:
    """Compile :func:`hash_uniform` for contiguous arrays, then freeze it."""
    hash_uniform(np.zeros(1, np.int64), np.zeros((1, 1), np.int64), np.zeros((1, 1)))
    hash_uniform.disable_compile()
