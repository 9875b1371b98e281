"""The integer dot-product kernels (:mod:`specsample.adapter.int_products`).

Each product is checked bit for bit against a NumPy replica of the arithmetic the module
documents (the activations' int8 codes and scales, the exact integer sums, then float32
operations one at a time), for int4 and int8 weights, one to seven rows, on the calling
thread and on numba's threads. The dot products by ``vpdpbusd`` and by plain vector
arithmetic give the same integers (where the CPU has the instruction). The layouts
round-trip.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

pytest.importorskip("numba")

from specsample.adapter import int_products as dots


def _codes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each group of 32 of ``x [n]`` (float32) as int8 codes ``[n // 32, 32]`` (int64) and
    their scales ``[n // 32]`` (float32), as the module's docstring says."""
    groups = x.reshape(-1, dots.GROUP)
    scales = (np.abs(groups).max(axis=1) / np.float32(127)).astype(np.float32)
    with np.errstate(divide="ignore"):
        inverse = np.where(scales > 0, np.float32(1) / scales, np.float32(0)).astype(np.float32)
    return np.rint(groups * inverse[:, None]).astype(np.int64), scales


def _replica(x: np.ndarray, integers: np.ndarray, scales: np.ndarray, offsets: Any) -> np.ndarray:
    """``x [rows, n] @ W^T`` as the kernels compute it, for int4 weights (``offsets`` given,
    ``q`` in 0..15) or int8 ones (``offsets`` None)."""
    out = np.empty((x.shape[0], integers.shape[0]), np.float32)
    for r, row in enumerate(x):
        codes, steps = _codes(row)
        for g, (code, d) in enumerate(zip(codes, steps, strict=True)):
            weights = integers[:, g * dots.GROUP : (g + 1) * dots.GROUP].astype(np.int64)
            total = int(code.sum())
            if offsets is None:
                term = (weights @ code).astype(np.float32) * (scales[:, g] * d)
            else:
                exact = (weights @ code - 8 * total).astype(np.float32)
                term = exact * (scales[:, g] * d) + offsets[:, g] * np.float32(
                    d * np.float32(total)
                )
            out[r] = term if g == 0 else out[r] + term
    return out


def _blocks(values: np.ndarray) -> np.ndarray:
    """``[out, groups]`` as ``[out // 16, groups, 16]``."""
    out, groups = values.shape
    return np.ascontiguousarray(values.reshape(out // 16, 16, groups).transpose(0, 2, 1))


def _int4_case(out: int, inputs: int, seed: int) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    integers = rng.integers(0, 16, (out, inputs), dtype=np.uint8)
    scales = (rng.random((out, inputs // 32), dtype=np.float32) * 0.02).astype(np.float32)
    offsets = ((rng.random((out, inputs // 32), dtype=np.float32) - 0.5) * 0.02).astype(np.float32)
    return integers, scales, offsets


def _run(kernel: Any, x: torch.Tensor, out_features: int, *tensors: Any) -> np.ndarray:
    """The product by ``kernel`` of weights, scales and offsets (``None`` for int8)."""
    out = torch.empty(x.shape[0], out_features)
    codes = torch.empty(x.numel(), dtype=torch.int8)
    addresses = [None if tensor is None else tensor.ctypes.data for tensor in tensors]
    kernel(
        x.data_ptr(),
        x.shape[0],
        x.shape[1],
        *addresses,
        out_features // 16,
        out.data_ptr(),
        codes.data_ptr(),
    )
    return out.numpy()


KERNELS = (dots.int_product, dots.int_product_serial)


@pytest.mark.parametrize("kind", ["int4", "int8"])
@pytest.mark.parametrize("shape", [(16, 32, 1), (48, 96, 3), (320, 576, 7)])
def test_products_are_the_documented_arithmetic_bit_for_bit(kind: str, shape: tuple) -> None:
    out, inputs, rows = shape
    integers, scales, offsets = _int4_case(out, inputs, seed=out)
    x = torch.randn(rows, inputs, generator=torch.Generator().manual_seed(rows))
    x[0, :32] = 0
    if kind == "int4":
        tensors = (dots.pack(integers), _blocks(scales), _blocks(offsets))
        expected = _replica(x.numpy(), integers, scales, offsets)
    else:
        signed = (integers.astype(np.int16) * 17 - 128).astype(np.int8)
        tensors = (dots.pack8(signed), _blocks(scales), None)
        expected = _replica(x.numpy(), signed, scales, None)
    assert not expected[0].any() or inputs > 32
    for kernel in KERNELS:
        np.testing.assert_array_equal(_run(kernel, x, out, *tensors), expected)


def test_each_row_is_computed_alone() -> None:
    integers, scales, offsets = _int4_case(64, 128, seed=3)
    tensors = (dots.pack(integers), _blocks(scales), _blocks(offsets))
    x = torch.randn(6, 128, generator=torch.Generator().manual_seed(0))
    together = _run(dots.int_product, x, 64, *tensors)
    for r in range(6):
        alone = _run(dots.int_product_serial, x[r : r + 1], 64, *tensors)
        np.testing.assert_array_equal(alone[0], together[r])


def _one_group(intrinsic: Any) -> Any:
    """A kernel calling ``intrinsic`` (int4 terms) once, on the first group of each address,
    compiled here, uncached."""
    import numba

    @numba.njit
    def run(weights: int, activations: int, scales: int, offsets: int, out: int) -> None:
        d, t = np.float32(0.5), np.int32(3)
        intrinsic(weights, 0, activations, 0, scales, offsets, 0, out, 0, d, t, True)

    return run


@pytest.mark.skipif(not dots.fast(), reason="the CPU lacks AVX512-VNNI")
def test_vnni_and_plain_vector_dot_products_agree() -> None:
    integers, scales, offsets = _int4_case(16, 32, seed=5)
    arrays = (dots.pack(integers), _blocks(scales), _blocks(offsets))
    activations = np.random.default_rng(1).integers(-127, 128, 32, dtype=np.int8)
    results = []
    for vnni in (True, False):
        out = np.zeros(16, np.float32)
        run = _one_group(dots.group_intrinsic(vnni))
        run(
            arrays[0].ctypes.data,
            activations.ctypes.data,
            arrays[1].ctypes.data,
            arrays[2].ctypes.data,
            out.ctypes.data,
        )
        results.append(out)
    np.testing.assert_array_equal(results[0], results[1])
    exact = (integers.astype(np.int64) @ activations.astype(np.int64) - 24).astype(np.float32)
    np.testing.assert_array_equal(
        results[0], exact * (scales[:, 0] * np.float32(0.5)) + offsets[:, 0] * np.float32(1.5)
    )


def test_layouts_refuse_shapes_the_kernels_do_not_take() -> None:
    with pytest.raises(ValueError, match="integers must be"):
        dots.pack(np.zeros((8, 32), np.uint8))
    with pytest.raises(ValueError, match="integers must be"):
        dots.pack8(np.zeros((16, 48), np.int8))
