"""Float32 arithmetic of the logits kernels, as :mod:`specsample.probs` does it in PyTorch.

:func:`scaled` computes ``z = (logit - shift) / T`` as :func:`specsample.probs.scaled_logits`
does, value for value, and :func:`prob` the probability ``exp(z - log_norm)`` of a kept
token. :func:`exp32` is a float32 exponential accurate to about one unit in the last place,
written so that the compiler vectorises it, with fused multiply-adds; PyTorch's own ``exp``
rounds differently in about one value in ten, by one unit in the last place.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from specsample.kernels.cpu.compiler import njit

_LOG2E = np.float32(1.44269504)
_LN2_HIGH = np.float32(0.693359375)
_LN2_LOW = np.float32(-2.12194440e-4)
_TWO_TO_MINUS_25 = np.float32(2.0**-25)
_P = (
    np.float32(1.9875691500e-4),
    np.float32(1.3981999507e-3),
    np.float32(8.3334519073e-3),
    np.float32(4.1665795894e-2),
    np.float32(1.6666665459e-1),
    np.float32(5.0000001201e-1),
)


@intrinsic
def _bits_to_float32(typingctx, bits):  # type: ignore[no-untyped-def]
    """The float32 whose IEEE bits are the int32 ``bits``."""
    signature = types.float32(types.int32)

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        return builder.bitcast(args[0], ir.FloatType())

    return signature, codegen


@intrinsic
def _fma(typingctx, a, b, c):  # type: ignore[no-untyped-def]
    """``a * b + c`` rounded once (float32): the ``llvm.fma`` intrinsic, which vectorises into
    the processor's fused multiply-add where it has one and is computed exactly otherwise."""
    signature = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, sig, args):  # type: ignore[no-untyped-def]
        f32 = ir.FloatType()
        fma = builder.module.declare_intrinsic(
            "llvm.fma", [f32], ir.FunctionType(f32, [f32, f32, f32])
        )
        return builder.call(fma, args)

    return signature, codegen


@njit(inline="always")
def _power_of_two(n: np.int32) -> np.float32:
    """``2 ** n`` for an integer ``n`` in ``[-126, 127]``."""
    return _bits_to_float32(np.int32((n + np.int32(127)) << np.int32(23)))  # type: ignore[call-arg]


@njit(inline="always")
def exp32(x: np.float32) -> np.float32:
    """``exp(x)`` in float32 for ``x <= 0`` (``-inf`` gives 0), to about one ulp.

    Range reduction ``x = n log 2 + r`` with ``|r| <= log(2) / 2`` (``log 2`` split in two
    parts so ``n log 2`` is exact), a degree-7 polynomial for ``exp(r)`` in fused
    multiply-adds (a third fewer operations than separate ones, and each step rounded once),
    then the scaling by ``2 ** n`` as an exact multiplication by ``2 ** (n + 25)`` (a normal
    number for every ``n >= -150``) and one rounded by ``2 ** -25``, so results below
    float32's smallest normal number round as a single multiplication would.
    """
    x = max(x, np.float32(-104.0))
    n = np.floor(_fma(x, _LOG2E, np.float32(0.5)))  # type: ignore[call-arg]
    r = _fma(-n, _LN2_LOW, _fma(-n, _LN2_HIGH, x))  # type: ignore[call-arg]
    poly = _P[0]
    for c in _P[1:]:
        poly = _fma(poly, r, c)  # type: ignore[call-arg]
    y = _fma(poly, r * r, r) + np.float32(1.0)  # type: ignore[call-arg]
    return y * _power_of_two(np.int32(n) + np.int32(25)) * _TWO_TO_MINUS_25


@njit(inline="always")
def scaled(value: np.float32, shift: np.float32, scale: np.float32) -> np.float32:
    """``z`` of one logit, as :func:`specsample.probs.scaled_logits` computes it."""
    if value == shift:
        return np.float32(0.0)
    z = np.float32(value - shift) * scale
    return np.float32(0.0) if np.isnan(z) else z


@njit(inline="always")
def prob(value: np.float32, shift: np.float32, scale: np.float32, cut: np.float32,
         log_norm: np.float32) -> np.float32:  # fmt: skip
    """``q`` of one logit: ``exp(z - log_norm)`` where ``z >= cut``, else 0."""
    z = scaled(value, shift, scale)
    return exp32(z - log_norm) if z >= cut else np.float32(0.0)


BLOCK = 128
"""Logits a scan takes at once (:func:`block_largest`): long enough to amortise the
reduction of the vector lanes, short enough to find an index by rescanning one block."""


@njit(inline="always")
def order_key(bits: np.int32) -> np.int32:
    """An int32 key of a float32 given as its bits, ordered as the floats are (``-0.0`` just
    below ``+0.0``; NaN outside ``[-inf, +inf]``): comparisons of integers vectorise where
    those of floats, with their NaN semantics, do not."""
    return bits ^ ((bits >> np.int32(31)) & np.int32(0x7FFFFFFF))


@njit(inline="always")
def block_largest(bits: np.ndarray, start: int) -> tuple[np.float32, bool]:
    """The largest of the float32 values ``bits[start:start + BLOCK]`` (their int32 bits)
    and whether one of them is NaN (the largest is then meaningless)."""
    largest = np.int32(-0x7F800001)  # the key of -inf
    nan = 0
    for j in range(BLOCK):
        b = bits[start + j]
        key = order_key(b)
        largest = key if key > largest else largest
        nan |= (b & np.int32(0x7FFFFFFF)) > np.int32(0x7F800000)
    return _bits_to_float32(order_key(largest)), nan != 0  # type: ignore[call-arg]
